"""Per-request records: exact totals, a bounded uniform reservoir past ``max_records``, capped
distinct errors, and ``requests.csv``/``requests.jsonl`` written in order across batches (real files)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import orjson
import pytest

from mmgate.bench.client import ResponseResult
from mmgate.bench.planner import PlanCounts
from mmgate.bench.records import CSV_FIELDS, MAX_DISTINCT_ERRORS, RecordStore, RequestLog, RequestRecord

MS = 1_000_000


def record(i: int, *, error: str | None = None, tokens: int = 5, images: int = 2, data: int = 1,
           session: str = "s") -> RequestRecord:
    start = 1_000 * MS + i * 10 * MS
    result = ResponseResult(status=200 if error is None else 500, error=error, start_ns=start,
                            first_token_ns=start + 2 * MS, end_ns=start + 6 * MS, output_tokens=tokens,
                            content_chunks=tokens)
    counts = PlanCounts(logical_images=images, images_with_data=data, cache_only_refs=images - data,
                        stripped_refs=images - data, image_bytes_sent=100 * data)
    return RequestRecord(session, i, start - MS, result, counts, body_bytes=150 * data)


def test_totals_columns_and_itl() -> None:
    store = RecordStore(base_ns=1_000 * MS)
    for i in range(4):
        store.add(record(i))
    store.add(record(4, error="HTTP 500: boom", tokens=0))
    t = store.totals
    assert (t.requests, t.errors, t.output_tokens) == (5, 1, 20)
    assert (t.logical_images, t.images_with_data, t.cache_only_refs, t.image_bytes_sent, t.body_bytes) == (
        10, 5, 5, 500, 750)
    assert (t.first_start_ns, t.last_end_ns) == (1_000 * MS, 1_000 * MS + 46 * MS)
    assert list(store.ok_mask()) == [True, True, True, True, False]
    assert list(store.ms("ttft_ns")) == [2.0] * 4  # the failed request is left out
    assert list(store.ms("send_lag_ns", ok_only=False)) == [1.0] * 5
    assert list(store.column("start_ns")) == [0, 10 * MS, 20 * MS, 30 * MS, 40 * MS]
    # (latency 6 ms - TTFT 2 ms) / (5 - 1) tokens
    assert list(store.itl_ms()) == pytest.approx([1.0] * 4)
    assert store.errors == {"HTTP 500: boom": 1}


def test_reservoir_is_bounded_uniform_and_totals_stay_exact() -> None:
    store = RecordStore(base_ns=0, max_records=100, seed=7)
    n = 10_000
    for i in range(n):
        store.add(record(i))
    assert len(store) == 100
    assert store.totals.requests == n and store.totals.output_tokens == 5 * n
    turns = store.column("turn_index")
    assert len(set(turns.tolist())) == 100  # each row kept at most once
    # A uniform sample of 0..9999: its mean is near 5000 and it reaches both ends, not only the first 100.
    assert 3_500 < float(np.mean(turns)) < 6_500
    assert turns.min() < 1_000 and turns.max() > 9_000


def test_distinct_errors_are_capped() -> None:
    store = RecordStore(base_ns=0)
    for i in range(MAX_DISTINCT_ERRORS + 50):
        store.add(record(i, error=f"error number {i}"))
    store.add(record(0, error="x" * 500))  # long messages are keyed by their first 200 characters
    assert len(store.errors) == MAX_DISTINCT_ERRORS + 1
    assert store.errors["(other errors)"] == 51
    assert store.totals.errors == MAX_DISTINCT_ERRORS + 51


async def test_request_log_writes_every_row_in_order_across_batches(tmp_path: Path) -> None:
    log = RequestLog(tmp_path / "out", base_ns=1_000 * MS, batch=3)
    for i in range(10):
        log.add(record(i, error="bad" if i == 4 else None, session=f"s{i % 2}"))
    await log.close()
    with log.csv_path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == CSV_FIELDS
    assert [int(r["index"]) for r in rows] == list(range(10))
    assert rows[4]["error"] == "bad" and rows[4]["itl_ms"] == ""
    assert rows[1]["session_id"] == "s1" and float(rows[1]["start_s"]) == pytest.approx(0.01)
    lines = [orjson.loads(line) for line in log.jsonl_path.read_bytes().splitlines()]
    assert [r["index"] for r in lines] == list(range(10))
    assert lines[0]["ttft_ms"] == 2.0 and lines[0]["itl_ms"] == 1.0 and lines[4]["itl_ms"] is None
