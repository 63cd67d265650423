"""RSS of ``make run``'s process tree under a long sliding-window soak with new images.

Starts ``mmgate serve`` as ``make run`` does (the gateway, its front door and two embedded
engines, all defaults) and drives it with ``mmgate bench run``: chunks of N sessions x T turns,
window W, one new image a turn, each chunk with its own seed so every image of the soak is new.
The resident memory of the gateway process and all its children is sampled every ``--sample-s``
seconds and printed against the requests done.

    .venv/bin/python benchmarks/regression/soak_default.py --requests 100000 --out results/soak_default.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import re
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from rich.console import Console

from benchmarks._procs import ROOT, free_port, start, stop
from benchmarks._run import parse_args, write_results
from mmgate.bench.dataset import load_dataset
from mmgate.bench.runner import run_benchmark
from mmgate.bench.settings import BenchSettings
from mmgate.bench.synth import SlidingWindowSpec, generate_sliding_window

MiB = 1024 * 1024
QUICK = {"requests": 40, "sessions": 4, "turns": 10, "concurrency": 4, "sample_s": 0.5}


def tree(pid: int) -> list[int]:
    """``pid`` and every process under it."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(parents.get(p, ()))
    return out


def rss_mib(pid: int) -> float:
    total = 0
    for p in tree(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total / MiB


def requests_done(url: str) -> int:
    """The gateway's own count of chat requests answered (``mmgate_requests_total``)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return int(sum(float(m) for m in re.findall(r"^mmgate_requests_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)))


class Sampler(threading.Thread):
    """Samples the tree's RSS with the requests done so far, every ``interval`` seconds."""

    def __init__(self, pid: int, url: str, interval: float) -> None:
        super().__init__(daemon=True)
        self.pid, self.url, self.interval = pid, url, interval
        self.done_requests = 0
        self.samples: list[tuple[float, int, float]] = []
        self._halt = threading.Event()
        self._t0 = time.monotonic()

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            with contextlib.suppress(OSError):
                self.samples.append((time.monotonic() - self._t0, requests_done(self.url), rss_mib(self.pid)))

    def stop(self) -> None:
        self._halt.set()
        self.join()
        with contextlib.suppress(OSError):
            self.samples.append((time.monotonic() - self._t0, requests_done(self.url), rss_mib(self.pid)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--sessions", type=int, default=600, help="sessions per chunk")
    p.add_argument("--turns", type=int, default=20)
    p.add_argument("--window", type=int, default=4)
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--sample-s", type=float, default=5.0)
    p.add_argument("--serve-args", default="", help="more flags for `mmgate serve`")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "soak_default.json")
    args = parse_args(p, QUICK)
    port = free_port()
    proc = start(["serve", "--port", str(port), *args.serve_args.split()], port)
    url = f"http://127.0.0.1:{port}"
    work = Path(tempfile.mkdtemp(prefix="mmgate-soak-"))
    sampler = Sampler(proc.pid, url, args.sample_s)
    base = rss_mib(proc.pid)
    errors = 0
    try:
        sampler.start()
        chunk = 0
        while sampler.done_requests < args.requests:
            spec = SlidingWindowSpec(sessions=args.sessions, turns=args.turns, window=args.window,
                                     image_size=args.image_size, seed=chunk, output_length=8)
            dataset = generate_sliding_window(spec, work / f"c{chunk}").path
            left = args.requests - sampler.done_requests
            settings = BenchSettings(url=url, dataset=str(dataset), concurrency=args.concurrency,
                                     request_count=min(left, args.sessions * args.turns),
                                     session_prefix=f"c{chunk}-")
            out = asyncio.run(run_benchmark(settings, load_dataset(dataset, "single_turn"), None,
                                            console=Console(file=io.StringIO()), plots=False))
            totals = out.summary["totals"]
            sampler.done_requests += totals["requests"]
            errors += totals["errors"]
            shutil.rmtree(work / f"c{chunk}")
            print(f"  chunk {chunk}: {sampler.done_requests} requests, {errors} errors, "
                  f"RSS {rss_mib(proc.pid):.0f} MiB", file=sys.stderr)
            chunk += 1
    finally:
        try:
            sampler.stop()  # its last sample reads the gateway, so before the gateway stops
        finally:
            stop(proc)
            shutil.rmtree(work, ignore_errors=True)
    samples = sampler.samples
    warm = [s for s in samples if s[1] >= min(10_000, args.requests // 10)]
    result: dict[str, Any] = {
        "args": {k: str(v) for k, v in vars(args).items()}, "requests": sampler.done_requests, "errors": errors,
        "base_rss_mib": round(base, 1), "peak_rss_mib": round(max(s[2] for s in samples), 1),
        "after_warmup_min_mib": round(min(s[2] for s in warm), 1) if warm else None,
        "after_warmup_max_mib": round(max(s[2] for s in warm), 1) if warm else None,
        "samples": [{"s": round(t, 1), "requests": n, "rss_mib": round(r, 1)} for t, n, r in samples],
    }
    print(f"{'requests':>9} {'RSS MiB':>8}")
    step = max(1, len(samples) // 12)
    for t, n, r in samples[::step] + samples[-1:]:
        print(f"{n:>9} {r:>8.1f}   ({t:.0f} s)")
    print(f"base {base:.1f} MiB, peak {result['peak_rss_mib']} MiB; after warm-up "
          f"{result['after_warmup_min_mib']} to {result['after_warmup_max_mib']} MiB; errors {errors}")
    write_results(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
