"""The results of a run: ``summary.json``, ``summary.csv`` and the console table.

Definitions follow AIPerf: the benchmark duration runs from the first request sent to the last
response received; request throughput counts successful requests over it; output token
throughput is the successful requests' output tokens over it.
"""

from __future__ import annotations

import csv
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mmgate.bench.engine_metrics import EngineCounters
from mmgate.bench.overhead import ClientOverhead
from mmgate.bench.records import RecordStore
from mmgate.bench.stats import STAT_NAMES, Distribution, distribution, rate

SUMMARY_FORMAT = "mmgate-bench-summary/1"

# (key in summary["metrics"], label) in display order.
METRIC_LABELS: tuple[tuple[str, str], ...] = (
    ("ttft_ms", "TTFT (ms)"),
    ("inter_token_latency_ms", "Inter-token latency (ms)"),
    ("request_latency_ms", "Request latency (ms)"),
    ("output_tokens_per_request", "Output tokens/req"),
    ("logical_images_per_request", "Logical images/req"),
    ("images_with_data_per_request", "Images with data/req"),
    ("image_bytes_sent_per_request", "Image bytes/req"),
    ("request_bytes_per_request", "Request bytes/req"),
    ("videos_with_data_per_request", "Videos with data/req"),
    ("video_bytes_sent_per_request", "Video bytes/req"),
)
# Left out of the console table of a run that sent videos and no image.
IMAGE_ROWS = frozenset({"logical_images_per_request", "images_with_data_per_request", "image_bytes_sent_per_request",
                        "logical_images", "images_with_data", "image_bytes_sent"})
TOTAL_LABELS: tuple[tuple[str, str], ...] = (
    ("requests", "Requests"),
    ("successful", "Successful"),
    ("errors", "Errors"),
    ("error_rate", "Error rate"),
    ("duration_s", "Benchmark duration (s)"),
    ("request_throughput", "Request throughput (req/s)"),
    ("output_token_throughput", "Output token throughput (tok/s)"),
    ("logical_images", "Logical images"),
    ("images_with_data", "Images sent with data"),
    ("cache_only_refs", "Cache-only references"),
    ("stripped_refs", "  of which stripped by --uuid-and-strip"),
    ("image_bytes_sent", "Image bytes sent"),
    ("request_bytes_sent", "Request bytes sent"),
    ("logical_videos", "Logical videos"),
    ("videos_with_data", "Videos sent with data"),
    ("video_bytes_sent", "Video bytes sent"),
    ("unique_video_bytes", "Unique video bytes"),
    ("video_bytes_per_unique", "Video bytes sent ÷ unique"),
)
VIDEO_TOTALS = frozenset({"logical_videos", "videos_with_data", "video_bytes_sent", "unique_video_bytes",
                          "video_bytes_per_unique"})
ENGINE_LABELS: tuple[tuple[str, str], ...] = (
    ("cache_queries", "Engine processor-cache queries"),
    ("cache_hits", "Engine processor-cache hits"),
    ("request_bytes", "Engine request bytes received"),
    ("request_bytes_per_unique_video", "  ÷ unique video bytes"),
    ("video_bytes_est", "Engine video bytes (estimate)"),
    ("video_bytes_est_per_unique", "  ÷ unique video bytes"),
)


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def engine_summary(counters: EngineCounters, store: RecordStore) -> dict[str, Any]:
    """What the engines counted during the measured phase (``--engine-metrics``).

    ``video_bytes_est`` (runs without images only): the engines' request bytes less what the client's
    requests carried besides videos — exact against an engine directly; through a gateway off by the
    gateway's own rewrites (its uuid keys, a reference's envelope: tens of bytes a part).
    ``by_turn``: per turn index, from the reads around each request (``--concurrency 1`` only).
    """
    t = store.totals
    out: dict[str, Any] = {
        "cache_queries": counters.cache_queries,
        "cache_hits": counters.cache_hits,
        "request_bytes": counters.request_bytes,
        "request_bytes_per_unique_video": _ratio(counters.request_bytes, t.unique_video_bytes),
        "video_bytes_est": None,
        "video_bytes_est_per_unique": None,
    }
    if t.logical_videos and not t.logical_images:
        est = counters.request_bytes - (t.body_bytes - t.video_bytes_sent)
        out["video_bytes_est"] = est
        out["video_bytes_est_per_unique"] = _ratio(est, t.unique_video_bytes)
    queries, hits, turns = store.column("engine_cache_queries"), store.column("engine_cache_hits"), \
        store.column("turn_index")
    by_turn = []
    measured = queries >= 0
    for turn in sorted({int(x) for x in turns[measured]}):
        rows = measured & (turns == turn)
        by_turn.append({"turn": turn, "requests": int(rows.sum()), "cache_queries": int(queries[rows].sum()),
                        "cache_hits": int(hits[rows].sum())})
    out["by_turn"] = by_turn
    return out


def _dist(d: Distribution | None) -> dict[str, float] | None:
    return None if d is None else d.as_dict()


def build_summary(
    *,
    config: Mapping[str, Any],
    model: str,
    store: RecordStore,
    overhead: ClientOverhead,
    warnings: list[str],
    origin: Mapping[str, int] | None = None,
    prepared_images: tuple[int, int] = (0, 0),
) -> dict[str, Any]:
    """The JSON-able summary of a measured phase."""
    t = store.totals
    ok = store.ok_mask()
    duration_s = max(0, t.last_end_ns - t.first_start_ns) / 1e9 if t.requests else 0.0
    successful = t.requests - t.errors

    def per_request(name: str, scale: float = 1.0) -> dict[str, float] | None:
        return _dist(distribution(store.column(name).astype(float) * scale))

    metrics = {
        "ttft_ms": _dist(distribution(store.ms("ttft_ns"))),
        "inter_token_latency_ms": _dist(distribution(store.itl_ms())),
        "request_latency_ms": _dist(distribution(store.ms("latency_ns"))),
        "output_tokens_per_request": _dist(distribution(store.column("output_tokens")[ok].astype(float))),
        "logical_images_per_request": per_request("logical_images"),
        "images_with_data_per_request": per_request("images_with_data"),
        "image_bytes_sent_per_request": per_request("image_bytes_sent"),
        "request_bytes_per_request": per_request("body_bytes"),
    }
    if t.logical_videos:
        metrics["videos_with_data_per_request"] = per_request("videos_with_data")
        metrics["video_bytes_sent_per_request"] = per_request("video_bytes_sent")
    totals = {
        "requests": t.requests,
        "successful": successful,
        "errors": t.errors,
        "error_rate": t.errors / t.requests if t.requests else 0.0,
        "cache_misses": t.cache_misses,
        "duration_s": duration_s,
        "request_throughput": rate(successful, duration_s),
        "output_token_throughput": rate(t.output_tokens, duration_s),
        "output_tokens": t.output_tokens,
        "logical_images": t.logical_images,
        "images_with_data": t.images_with_data,
        "cache_only_refs": t.cache_only_refs,
        "stripped_refs": t.stripped_refs,
        "image_bytes_sent": t.image_bytes_sent,
        "request_bytes_sent": t.body_bytes,
        "logical_videos": t.logical_videos,
        "videos_with_data": t.videos_with_data,
        "video_bytes_sent": t.video_bytes_sent,
        "unique_videos": t.unique_videos,
        "unique_video_bytes": t.unique_video_bytes,
        "video_bytes_per_unique": _ratio(t.video_bytes_sent, t.unique_video_bytes),
    }
    return {
        "format": SUMMARY_FORMAT,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": model,
        "config": dict(config),
        "metrics": metrics,
        "totals": totals,
        "client": {
            "cpu_percent": overhead.cpu_percent,
            "cpu_s": overhead.cpu_s,
            "wall_s": overhead.wall_s,
            "cpu_count": overhead.cpu_count,
            "loop_lag_ms": _dist(overhead.loop_lag_ms),
            "send_lag_ms": _dist(overhead.send_lag_ms),
            "prepared_images": prepared_images[0],
            "prepared_image_bytes": prepared_images[1],
            "stored_records": len(store),
            "warnings": list(warnings),
        },
        "origin": dict(origin) if origin is not None else None,
        "errors": dict(sorted(store.errors.items(), key=lambda kv: -kv[1])),
    }


def write_summary(summary: Mapping[str, Any], directory: Path) -> list[Path]:
    """Write ``summary.json`` and ``summary.csv`` (long form: section, metric, stat, value)."""
    directory.mkdir(parents=True, exist_ok=True)
    json_path = directory / "summary.json"
    json_path.write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    csv_path = directory / "summary.csv"
    with csv_path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(("section", "metric", "stat", "value"))
        for name, dist in summary["metrics"].items():
            for stat in STAT_NAMES:
                writer.writerow(("metrics", name, stat, "" if dist is None else dist[stat]))
        for name, value in summary["totals"].items():
            writer.writerow(("totals", name, "value", "" if value is None else value))
        for name, value in (summary.get("engine") or {}).items():
            if name != "by_turn":
                writer.writerow(("engine", name, "value", "" if value is None else value))
        client = summary["client"]
        writer.writerow(("client", "cpu_percent", "value", client["cpu_percent"]))
        for name in ("loop_lag_ms", "send_lag_ms"):
            for stat in STAT_NAMES:
                writer.writerow(("client", name, stat, "" if client[name] is None else client[name][stat]))
    return [json_path, csv_path]


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != value:
            return "-"
        return f"{value:,.2f}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def print_summary(summary: Mapping[str, Any], console: Console) -> None:
    """The console table (plain text when not a terminal)."""
    table = Table(title=f"mmgate bench — {summary['model']}", title_justify="left")
    table.add_column("Metric", no_wrap=True)
    for stat in ("avg", "min", "max", "p50", "p90", "p99"):
        table.add_column(stat, justify="right")
    t = summary["totals"]
    videos = bool(t.get("logical_videos"))
    hidden = IMAGE_ROWS if videos and not t["logical_images"] else frozenset()
    for key, label in METRIC_LABELS:
        dist = summary["metrics"].get(key)
        if dist is not None and key not in hidden:
            table.add_row(label, *(_fmt(dist[s]) for s in ("avg", "min", "max", "p50", "p90", "p99")))
    console.print(table)
    totals = Table(show_header=False, box=None, padding=(0, 2))
    totals.add_column("name")
    totals.add_column("value", justify="right")
    for key, label in TOTAL_LABELS:
        if (key in VIDEO_TOTALS and not videos) or key in hidden:
            continue
        value = summary["totals"][key]
        totals.add_row(label, f"{value:.2%}" if key == "error_rate" else _fmt(value))
    engine: Mapping[str, Any] = summary.get("engine") or {}
    for key, label in ENGINE_LABELS if engine else ():
        totals.add_row(label, _fmt(engine[key]))
    for row in engine.get("by_turn", ()):
        totals.add_row(f"  turn {row['turn']}: engine cache hits / queries",
                       f"{row['cache_hits']:,} / {row['cache_queries']:,}")
    client = summary["client"]
    lag = client["loop_lag_ms"]
    totals.add_row("Client CPU (% of one core)", _fmt(client["cpu_percent"]))
    totals.add_row("Client loop lag p99 (ms)", _fmt(lag["p99"] if lag else None))
    send = client["send_lag_ms"]
    totals.add_row("Client send lag p99 (ms)", _fmt(send["p99"] if send else None))
    origin = summary.get("origin")
    if origin:
        totals.add_row("Image origin requests", _fmt(origin.get("requests")))
        totals.add_row("Image origin bytes", _fmt(origin.get("bytes_served")))
    console.print(totals)
    for message, count in list(summary["errors"].items())[:5]:
        console.print(f"[red]error (x{count}):[/red] {escape(message)}", highlight=False)
    for warning in client["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
