"""Per-request records: compact columns in memory, every row streamed to disk.

``RecordStore`` keeps totals exactly and per-request columns (``array``, 8 bytes a value) for the
distributions and plots. Memory is bounded: past ``max_records`` rows it keeps a uniform reservoir
sample (Algorithm R) instead, so percentiles stay unbiased on runs of any length.
``RequestLog`` appends every row to ``requests.csv`` and ``requests.jsonl``, batching writes into
a worker thread.
"""

from __future__ import annotations

import asyncio
import csv
import io
import random
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from mmgate.bench.client import ResponseResult
from mmgate.bench.planner import PlanCounts
from mmgate.bench.stats import inter_token_latency_ns

MAX_DISTINCT_ERRORS = 200
_INT_COLUMNS = ("start_ns", "send_lag_ns", "ttft_ns", "latency_ns", "output_tokens", "status",
                "turn_index", "logical_images", "images_with_data", "cache_only_refs",
                "stripped_refs", "image_bytes_sent", "body_bytes", "logical_videos", "videos_with_data",
                "video_bytes_sent", "engine_cache_queries", "engine_cache_hits")
CSV_FIELDS = ("index", "session_id", "turn", "start_s", "send_lag_ms", "ttft_ms", "latency_ms",
              "itl_ms", "output_tokens", "status", "error", "logical_images", "images_with_data",
              "cache_only_refs", "stripped_refs", "image_bytes_sent", "body_bytes", "logical_videos",
              "videos_with_data", "video_bytes_sent", "engine_cache_queries", "engine_cache_hits")
# Distinct videos remembered for the run's unique video bytes (the dataset's clips, at most).
MAX_UNIQUE_VIDEOS = 1_000_000


@dataclass(slots=True)
class RequestRecord:
    """One finished request: who, when it should have left, what was sent, what came back."""

    session_id: str
    turn_index: int
    intended_ns: int
    result: ResponseResult
    counts: PlanCounts
    body_bytes: int
    # The engine's processor-cache (queries, hits) during this request (``--engine-metrics`` with one
    # request at a time); None when not measured.
    engine_cache: tuple[int, int] | None = None

    @property
    def latency_ns(self) -> int:
        return self.result.end_ns - self.result.start_ns

    @property
    def ttft_ns(self) -> int:
        r = self.result
        return r.first_token_ns - r.start_ns if r.first_token_ns >= 0 else -1

    @property
    def send_lag_ns(self) -> int:
        return max(0, self.result.start_ns - self.intended_ns)


@dataclass(slots=True)
class Totals:
    """Exact counts over every measured request."""

    requests: int = 0
    errors: int = 0
    cache_misses: int = 0
    output_tokens: int = 0
    logical_images: int = 0
    images_with_data: int = 0
    cache_only_refs: int = 0
    stripped_refs: int = 0
    image_bytes_sent: int = 0
    body_bytes: int = 0
    logical_videos: int = 0
    videos_with_data: int = 0
    video_bytes_sent: int = 0
    unique_videos: int = 0
    unique_video_bytes: int = 0
    first_start_ns: int = 0
    last_end_ns: int = 0


class RecordStore:
    """Totals plus bounded per-request columns. ``base_ns`` is the run's time origin."""

    def __init__(self, base_ns: int, max_records: int = 5_000_000, seed: int = 0) -> None:
        self.base_ns = base_ns
        self.max_records = max(1, max_records)
        self.totals = Totals()
        self.errors: dict[str, int] = {}
        self._cols: dict[str, array[int]] = {name: array("q") for name in _INT_COLUMNS}
        self._rng = random.Random(seed)
        self._videos: set[str] = set()

    def __len__(self) -> int:
        return len(self._cols["start_ns"])

    def add(self, record: RequestRecord) -> None:
        r = record.result
        t = self.totals
        if t.requests == 0 or r.start_ns < t.first_start_ns:
            t.first_start_ns = r.start_ns
        t.last_end_ns = max(t.last_end_ns, r.end_ns)
        t.requests += 1
        c = record.counts
        t.logical_images += c.logical_images
        t.images_with_data += c.images_with_data
        t.cache_only_refs += c.cache_only_refs
        t.stripped_refs += c.stripped_refs
        t.image_bytes_sent += c.image_bytes_sent
        t.body_bytes += record.body_bytes
        t.logical_videos += c.logical_videos
        t.videos_with_data += c.videos_with_data
        t.video_bytes_sent += c.video_bytes_sent
        for content, size in c.videos:
            if content not in self._videos and len(self._videos) < MAX_UNIQUE_VIDEOS:
                self._videos.add(content)
                t.unique_videos += 1
                t.unique_video_bytes += size
        if r.error is not None:
            t.errors += 1
            t.cache_misses += r.cache_miss
            self._count_error(r.error)
        else:
            t.output_tokens += r.output_tokens
        row = (r.start_ns - self.base_ns, record.send_lag_ns, record.ttft_ns, record.latency_ns,
               r.output_tokens, r.status if r.error is None else -max(r.status, 1), record.turn_index,
               c.logical_images, c.images_with_data, c.cache_only_refs, c.stripped_refs,
               c.image_bytes_sent, record.body_bytes, c.logical_videos, c.videos_with_data, c.video_bytes_sent,
               *(record.engine_cache or (-1, -1)))
        if len(self) < self.max_records:
            for name, value in zip(_INT_COLUMNS, row, strict=True):
                self._cols[name].append(value)
            return
        slot = self._rng.randrange(t.requests)  # reservoir: keep each row with p = max/seen
        if slot < self.max_records:
            for name, value in zip(_INT_COLUMNS, row, strict=True):
                self._cols[name][slot] = value

    def _count_error(self, message: str) -> None:
        key = message[:200]
        if key not in self.errors and len(self.errors) >= MAX_DISTINCT_ERRORS:
            key = "(other errors)"
        self.errors[key] = self.errors.get(key, 0) + 1

    def column(self, name: str) -> np.ndarray:
        """A column as int64 numpy array (a copy-free view)."""
        col = self._cols[name]
        return np.frombuffer(col, dtype=np.int64) if len(col) else np.zeros(0, dtype=np.int64)

    def ok_mask(self) -> np.ndarray:
        return self.column("status") > 0

    def ms(self, name: str, ok_only: bool = True, valid_only: bool = True) -> np.ndarray:
        """Column ``name`` (nanoseconds) in milliseconds; negative (absent) values dropped."""
        values = self.column(name).astype(np.float64)
        keep = np.ones(values.shape, dtype=bool)
        if ok_only:
            keep &= self.ok_mask()
        if valid_only:
            keep &= values >= 0
        return values[keep] / 1e6

    def itl_ms(self) -> np.ndarray:
        """AIPerf's inter-token latency of successful requests with at least two tokens (ms)."""
        ok = self.ok_mask()
        lat = self.column("latency_ns")[ok].astype(np.float64)
        ttft = self.column("ttft_ns")[ok].astype(np.float64)
        toks = self.column("output_tokens")[ok]
        valid = (toks >= 2) & (ttft >= 0) & (lat >= ttft)
        return (lat[valid] - ttft[valid]) / (toks[valid] - 1) / 1e6


def record_row(index: int, record: RequestRecord, base_ns: int) -> dict[str, Any]:
    """One per-request row (CSV and JSONL share it)."""
    r = record.result
    ttft = record.ttft_ns
    itl = inter_token_latency_ns(record.latency_ns, ttft, r.output_tokens) if r.error is None else float("nan")
    c = record.counts
    return {
        "index": index, "session_id": record.session_id, "turn": record.turn_index,
        "start_s": round((r.start_ns - base_ns) / 1e9, 6), "send_lag_ms": round(record.send_lag_ns / 1e6, 4),
        "ttft_ms": round(ttft / 1e6, 4) if ttft >= 0 else None,
        "latency_ms": round(record.latency_ns / 1e6, 4),
        "itl_ms": None if itl != itl else round(itl / 1e6, 4),
        "output_tokens": r.output_tokens, "status": r.status, "error": r.error,
        "logical_images": c.logical_images, "images_with_data": c.images_with_data,
        "cache_only_refs": c.cache_only_refs, "stripped_refs": c.stripped_refs,
        "image_bytes_sent": c.image_bytes_sent, "body_bytes": record.body_bytes,
        "logical_videos": c.logical_videos, "videos_with_data": c.videos_with_data,
        "video_bytes_sent": c.video_bytes_sent,
        "engine_cache_queries": None if record.engine_cache is None else record.engine_cache[0],
        "engine_cache_hits": None if record.engine_cache is None else record.engine_cache[1],
    }


class RequestLog:
    """Streams per-request rows to ``requests.csv`` and ``requests.jsonl`` in batches."""

    def __init__(self, directory: Path, base_ns: int, batch: int = 2048) -> None:
        self.csv_path = directory / "requests.csv"
        self.jsonl_path = directory / "requests.jsonl"
        self._base_ns = base_ns
        self._batch = batch
        self._rows: list[dict[str, Any]] = []
        self._count = 0
        self._pending: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
        directory.mkdir(parents=True, exist_ok=True)
        with self.csv_path.open("w", newline="") as f:
            csv.writer(f).writerow(CSV_FIELDS)
        self.jsonl_path.write_bytes(b"")

    def add(self, record: RequestRecord) -> None:
        self._rows.append(record_row(self._count, record, self._base_ns))
        self._count += 1
        if len(self._rows) >= self._batch:
            rows, self._rows = self._rows, []
            task = asyncio.get_running_loop().create_task(self._flush(rows))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def close(self) -> None:
        rows, self._rows = self._rows, []
        if self._pending:
            await asyncio.gather(*self._pending)
        await self._flush(rows)

    async def _flush(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        async with self._lock:  # keep batches in order
            await asyncio.to_thread(self._write, rows)

    def _write(self, rows: list[dict[str, Any]]) -> None:
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=CSV_FIELDS)
        writer.writerows({k: ("" if v is None else v) for k, v in row.items()} for row in rows)
        with self.csv_path.open("a", newline="") as f:
            f.write(text.getvalue())
        with self.jsonl_path.open("ab") as fb:
            fb.write(b"".join(orjson.dumps(row) + b"\n" for row in rows))
