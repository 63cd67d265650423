"""The results of a run: the summary's AIPerf definitions (duration first send → last response,
throughput of successful requests), ``summary.json``/``summary.csv`` on disk, and the console
table (server-provided error text printed literally, never as rich markup)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import orjson
import pytest
from rich.console import Console

from mmgate.bench.compare import load_summary
from mmgate.bench.overhead import ClientOverhead
from mmgate.bench.records import RecordStore
from mmgate.bench.report import SUMMARY_FORMAT, build_summary, print_summary, write_summary
from mmgate.bench.stats import distribution
from tests.bench.test_records import MS, record


def summary_of(store: RecordStore) -> dict[str, Any]:
    overhead = ClientOverhead(12.5, 0.125, 1.0, distribution([0.1, 0.2]), distribution([0.3]))
    return build_summary(config={"concurrency": 2}, model="m", store=store, overhead=overhead,
                         warnings=["slow [client]"], origin={"requests": 3, "bytes_served": 300},
                         prepared_images=(2, 200))


@pytest.fixture
def store() -> RecordStore:
    s = RecordStore(base_ns=1_000 * MS)
    for i in range(4):  # requests start 10 ms apart and last 6 ms: first start 0, last end 36 ms
        s.add(record(i, tokens=9))
    s.add(record(4, error="[bold red]HTTP 500[/]: boom", tokens=0))
    return s


def test_summary_follows_aiperf_definitions(store: RecordStore) -> None:
    summary = summary_of(store)
    t = summary["totals"]
    assert summary["format"] == SUMMARY_FORMAT and summary["model"] == "m"
    assert (t["requests"], t["successful"], t["errors"]) == (5, 4, 1)
    assert t["error_rate"] == pytest.approx(0.2)
    assert t["duration_s"] == pytest.approx(0.046)  # first send to last response, the failed one included
    assert t["request_throughput"] == pytest.approx(4 / 0.046)  # successful requests only
    assert t["output_token_throughput"] == pytest.approx(36 / 0.046)
    assert summary["metrics"]["ttft_ms"]["p50"] == pytest.approx(2.0)
    assert summary["metrics"]["ttft_ms"]["count"] == 4
    assert summary["metrics"]["inter_token_latency_ms"]["avg"] == pytest.approx(0.5)  # (6-2)/(9-1)
    assert summary["client"]["stored_records"] == 5 and summary["client"]["prepared_images"] == 2
    assert summary["errors"] == {"[bold red]HTTP 500[/]: boom": 1}


def test_empty_run_has_zero_rates_and_no_distributions() -> None:
    summary = summary_of(RecordStore(base_ns=0))
    assert summary["totals"]["duration_s"] == 0.0 and summary["totals"]["request_throughput"] == 0.0
    assert summary["metrics"]["ttft_ms"] is None
    print_summary(summary, Console(file=io.StringIO(), width=120))  # prints "-" rather than failing


def test_written_summary_reads_back_and_csv_is_long_form(store: RecordStore, tmp_path: Path) -> None:
    summary = summary_of(store)
    json_path, csv_path = write_summary(summary, tmp_path / "run")
    assert load_summary(tmp_path / "run") == orjson.loads(json_path.read_bytes())
    with csv_path.open(newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["section", "metric", "stat", "value"]
    by_key = {(r[0], r[1], r[2]): r[3] for r in rows[1:]}
    assert float(by_key[("metrics", "ttft_ms", "p50")]) == pytest.approx(2.0)
    assert by_key[("totals", "errors", "value")] == "1"
    assert float(by_key[("client", "cpu_percent", "value")]) == 12.5


def test_console_table_prints_error_text_literally(store: RecordStore) -> None:
    out = io.StringIO()
    print_summary(summary_of(store), Console(file=out, width=120, color_system=None))
    text = out.getvalue()
    for label in ("TTFT (ms)", "Request throughput (req/s)", "Image origin requests", "Error rate"):
        assert label in text
    assert "20.00%" in text
    assert "[bold red]HTTP 500[/]: boom" in text  # escaped: a server cannot style (or break) the console
    assert "warning: slow [client]" in text
