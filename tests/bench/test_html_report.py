"""The bench's reports as a person sees them: two real runs against the sim (resending, then
stripping), their ``report.html`` and the comparison's ``compare.html``, rendered by a real headless
Chromium (Debian's package; ``make test`` installs it). The screenshots must not be blank, and every
figure the rendered page shows must be the JSON's."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from PIL import Image
from rich.console import Console

from mmgate.bench.compare import print_comparison
from mmgate.bench.dataset import load_dataset
from mmgate.bench.html import fmt
from mmgate.bench.runner import run_benchmark
from mmgate.bench.settings import BenchSettings
from mmgate.sim.server import SimServer

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is missing: make test installs it "
                                                          "(Debian: apt-get install chromium)")
_CELL = re.compile(r'data-key="([^"]+)">([^<]*)<')


def chromium(*args: str) -> subprocess.CompletedProcess[bytes]:
    assert CHROMIUM is not None
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           *args], capture_output=True, timeout=120, check=True)


def rendered_cells(page: Path) -> dict[str, str]:
    """``data-key`` → text of every figure in the DOM as Chromium rendered it."""
    dom = chromium("--dump-dom", page.as_uri()).stdout.decode()
    return {key: text for key, text in _CELL.findall(dom)}


def screenshot_is_not_blank(page: Path, out: Path) -> None:
    chromium(f"--screenshot={out}", "--window-size=1200,1600", page.as_uri())
    pixels = np.asarray(Image.open(out).convert("L"), dtype=np.float32)
    assert pixels.std() > 10, "the screenshot is blank"
    assert (pixels < 128).mean() > 0.01  # text and plots, not a white page


def lookup(data: dict[str, Any], key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        node = node[part]
    return node


async def test_run_and_comparison_reports_render_with_the_json_figures(
    sim: SimServer, sliding_window: Path, tmp_path: Path
) -> None:
    sessions = load_dataset(sliding_window, "single_turn")
    quiet = Console(file=io.StringIO())
    for name, strip in (("resend", False), ("strip", True)):
        await run_benchmark(BenchSettings(url=sim.url, dataset=str(sliding_window), concurrency=2,
                                          uuid_and_strip=strip), sessions, tmp_path / name, console=quiet, name=name)
    for name in ("resend", "strip"):
        summary = orjson.loads((tmp_path / name / "summary.json").read_bytes())
        assert summary["name"] == name
        page = tmp_path / name / "report.html"
        assert f"mmgate bench — {name}" in page.read_text()
        cells = rendered_cells(page)
        assert len(cells) >= 20 and "metrics.ttft_ms.p50" in cells and "totals.images_with_data" in cells
        for key, text in cells.items():
            assert text == fmt(lookup(summary, key)), key
        screenshot_is_not_blank(page, tmp_path / f"{name}.png")
    print_comparison(str(tmp_path / "resend"), str(tmp_path / "strip"), quiet, output_dir=tmp_path / "cmp")
    compared = orjson.loads((tmp_path / "cmp" / "compare.json").read_bytes())
    assert (compared["a"], compared["b"]) == ("resend", "strip")
    rows = {r["metric"]: r for r in compared["rows"]}
    assert rows["images_with_data"]["ratio"] < 1  # the stripping run sent fewer images with data
    cells = rendered_cells(tmp_path / "cmp" / "compare.html")
    for key, text in cells.items():
        side, metric = key.split(".", 1)
        assert text == fmt(rows[metric]["ratio" if side == "ratio" else side]), key
    assert "ratio.images_with_data" in cells
    assert (tmp_path / "cmp" / "compare.png").stat().st_size > 5000
    screenshot_is_not_blank(tmp_path / "cmp" / "compare.html", tmp_path / "cmp.png")
