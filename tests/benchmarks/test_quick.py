"""Every regression run under ``benchmarks/regression/`` that needs no real vLLM, and every study
that takes ``--quick``, in its ``--quick`` mode (a tiny workload), so that ``make test`` keeps each
one running: it exits 0, prints its table and writes JSON with the keys its readers use. Each runs as a process, as a user runs it (no test
imports a benchmark); nothing is timed: the figures of a quick run mean nothing.

The runs start together at the module's first test, two at a time (two cores), and each test waits
for its own. Not here: ``fleet_faults.py`` (~30 s even quick; ``tests/fleet/test_fleet_faults.py``
runs the same phases, from the same ``tests/fleet/faults.py``), ``sim_fidelity.py`` and
``agent_capacity.py`` (each starts a real vLLM replica, 60-90 s; ``agent_capacity.py --quick`` takes
~70 s in all).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
ROUTER = ROOT / "build" / "vllm-router-venv" / "bin" / "vllm-router"
TIMEOUT_S = 100


@dataclass(frozen=True)
class Quick:
    header: str  # a column title of the table it prints
    keys: frozenset[str]  # top-level keys of its JSON
    args: tuple[str, ...] = ()  # beyond --quick and --out
    group: str = "regression"  # its folder under benchmarks/


QUICK = {
    "passthrough_cost": Quick("µs CPU/request", frozenset({"requests", "concurrency", "cpu_us_per_request"})),
    "shared_hit": Quick("÷ raw GET", frozenset({"args", "p50_us"})),
    "sync_message_cost": Quick("lag p50 ms", frozenset({"args", "costs", "floods", "runs"})),
    "image_affinity": Quick("processed", frozenset({"args", "rows", "runs"})),
    "gateway_overhead": Quick("added p50", frozenset({"image_bytes", "results"})),
    "router_compare": Quick("added/router", frozenset({"args", "rows"})),
    "soak_default": Quick("RSS MiB", frozenset({"requests", "errors", "base_rss_mib", "peak_rss_mib", "samples"})),
    "bench_fidelity": Quick("req/s", frozenset({"rows", "requests", "concurrency"})),
    "chaos_shared_tier": Quick("up_hit_rate", frozenset({"settings", "phases"})),
    "image_pipeline": Quick("origin requests", frozenset({"latency", "bursts", "aims_met"})),
    "decode_bombs": Quick("Pillow decode ms", frozenset({"cpu_per_pixel", "rows", "victim"})),
    "large_body": Quick("/health max ms", frozenset({"images", "body_mb", "rounds", "summary"})),
    "attacks": Quick("p99/unloaded", frozenset({"phases", "side_channel"})),
    "edge_load": Quick("p99/unloaded", frozenset({"phases", "rounds", "soak", "ulimit_n"})),
    "reuse_sliding_window": Quick("img sent", frozenset({"args", "rows"})),
    "vllm_sliding_window": Quick("TTFT p50 of rounds", frozenset({"args", "runs"}), ("--log-dir", "logs")),
    "agent_turn_stages": Quick("plan+body µs", frozenset({"args", "rows"})),
    "agent_turn_cpu": Quick("gw CPU ms/turn", frozenset({"args", "runs", "rows"}), group="studies"),
}


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str
    result: dict[str, Any] | None


def run(name: str, workdir: Path) -> Ran:
    spec = QUICK[name]
    out = workdir / f"{name}.json"
    script = BENCHMARKS / spec.group / f"{name}.py"
    done = subprocess.run([sys.executable, str(script), "--quick", "--out", str(out), *spec.args],
                          capture_output=True, text=True, timeout=TIMEOUT_S, cwd=workdir)
    return Ran(done.returncode, done.stdout, done.stderr, json.loads(out.read_text()) if out.exists() else None)


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[dict[str, Future[Ran]]]:
    """The runs of the tests selected (``-k agent`` starts only those)."""
    selected = {item.callspec.params["name"] for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")}
    names = [n for n in QUICK if n in selected and (n != "router_compare" or ROUTER.exists())]
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {n: pool.submit(run, n, tmp_path_factory.mktemp(n)) for n in names}
        yield futures
        for future in futures.values():
            future.cancel()


@pytest.mark.parametrize("name", list(QUICK))
def test_a_regression_run_works_in_its_quick_mode(name: str, runs: dict[str, Future[Ran]]) -> None:
    if name not in runs:
        pytest.skip(f"{ROUTER} is missing (the script would install vllm-router from PyPI)")
    ran = runs[name].result(timeout=3 * TIMEOUT_S)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert QUICK[name].header in ran.stdout, ran.stdout[-3000:]
    assert ran.result is not None, "no JSON written"
    assert QUICK[name].keys <= ran.result.keys(), sorted(ran.result)
    if name == "image_affinity":  # every profile it names starts by --routing, lru-history included
        rows = ran.result["rows"]
        assert [row["mode"] for row in rows] == ["lru-history", "image-affinity"]
        for row in rows:
            assert (row["requests"], row["errors"]) == (4, 0), row
            assert sum(row["decisions"].values()) == 4, row  # every request routed by the profile
            assert row["engine_images_processed"] >= row["unique_images"], row
