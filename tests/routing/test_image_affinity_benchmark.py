"""``benchmarks/regression/image_affinity.py``, the routing's regression benchmark, on a tiny workload, so that
``make test`` keeps it running: every profile it names starts by ``--routing`` (``lru-history``
included), and no request fails. Run as a process, as a user runs it (no test imports a
benchmark); nothing is timed: docs/ROUTING.md holds its figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "regression" / "image_affinity.py"


def test_the_routing_benchmark_runs_each_profile_by_name(tmp_path: Path) -> None:
    out = tmp_path / "image_affinity.json"
    subprocess.run(
        [sys.executable, str(SCRIPT), "--backends", "2", "--gateways", "1", "--sessions", "2", "--turns", "2",
         "--concurrency", "2", "--pool", "4", "--modes", "lru-history,image-affinity", "--out", str(out)],
        check=True, capture_output=True, timeout=110, cwd=tmp_path)
    rows = json.loads(out.read_text())["rows"]
    assert [row["mode"] for row in rows] == ["lru-history", "image-affinity"]
    for row in rows:
        assert (row["requests"], row["errors"]) == (4, 0), row
        assert sum(row["decisions"].values()) == 4, row  # every request routed by the profile
        assert row["engine_images_processed"] >= row["unique_images"], row
