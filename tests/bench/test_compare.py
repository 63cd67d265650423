"""``bench compare`` on real files (a run directory or its summary.json; missing, not JSON, not
ours: one clean error each) and the PNG plots of a run (real PNGs; no data, no plot)."""

from __future__ import annotations

import io
from pathlib import Path

import orjson
import pytest
from rich.console import Console

from mmgate.bench.compare import load_summary, print_comparison
from mmgate.bench.errors import ResultFileError
from mmgate.bench.plots import write_plots
from mmgate.bench.records import RecordStore
from mmgate.bench.report import write_summary
from tests.bench.test_records import MS, record
from tests.bench.test_report import summary_of


def run_dir(tmp_path: Path, name: str, data_per_request: int) -> Path:
    store = RecordStore(base_ns=1_000 * MS)
    for i in range(4):
        store.add(record(i, images=4, data=data_per_request))
    write_summary(summary_of(store), tmp_path / name)
    return tmp_path / name


def test_compare_prints_b_over_a_from_directories_or_files(tmp_path: Path) -> None:
    a = run_dir(tmp_path, "resend", 4)
    b = run_dir(tmp_path, "strip", 1)
    out = io.StringIO()
    assert print_comparison(str(a), str(b / "summary.json"), Console(file=out, width=160, color_system=None)) == 0
    lines = {line.split("│")[1].strip(): line for line in out.getvalue().splitlines() if line.count("│") >= 4}
    assert "0.250" in lines["images_with_data"]  # 4 of 16 images with data, over 16 of 16
    assert "ttft_ms.p50" in lines and "ttft_ms.min" not in lines  # avg/p50/p90/p99 only by default
    assert f"A={a}" in "".join(out.getvalue().split())  # the title wraps at the table's width


@pytest.mark.parametrize(
    ("content", "fragment"),
    [(None, "cannot read"), (b"{not json", "not JSON"), (orjson.dumps({"format": "aiperf/1"}), "not an mmgate bench")],
)
def test_bad_result_files_are_one_clean_error(tmp_path: Path, content: bytes | None, fragment: str) -> None:
    path = tmp_path / "summary.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ResultFileError, match=fragment) as info:
        load_summary(tmp_path)  # a directory: its summary.json
    assert str(path) in info.value.message


def test_plots_are_real_pngs_and_skipped_without_data(tmp_path: Path) -> None:
    store = RecordStore(base_ns=1_000 * MS)
    for i in range(30):
        store.add(record(i, error="boom" if i % 10 == 0 else None))
    written = write_plots(store, tmp_path / "plots", title="t")
    assert [p.name for p in written] == ["ttft.png", "latency_over_time.png", "bytes_per_turn.png"]
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5_000
    assert write_plots(RecordStore(base_ns=0), tmp_path / "empty") == []
    assert list((tmp_path / "empty").iterdir()) == []
