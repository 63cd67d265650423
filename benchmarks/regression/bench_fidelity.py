"""How fast and how exact is ``mmgate bench`` itself? Drive a zero-latency endpoint and see.

The endpoint (``benchmarks/servers/zero_latency_server.py``) runs in its own process and answers every
request at once, so (a) the highest request rate the tool reaches is the client's ceiling, and
(b) the TTFT and latency it reports are pure client + loopback overhead (the server's own
latency is zero). For reference the same load is also driven by a bare aiohttp loop (no dataset,
no bookkeeping): the gap between the two is what the benchmark's machinery costs.

    .venv/bin/python benchmarks/regression/bench_fidelity.py --requests 20000 --concurrency 32

Prints a table and writes JSON (default ``results/bench_fidelity.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
from rich.console import Console

from benchmarks._procs import SERVERS, free_port
from benchmarks._run import parse_args, write_results
from mmgate.app_runtime import install_uvloop
from mmgate.bench.dataset import Session, Turn
from mmgate.bench.runner import run_benchmark
from mmgate.bench.settings import BenchSettings
from mmgate.bench.stats import distribution

QUICK = {"requests": 40, "concurrency": 4}


def start_server(port: int, tokens: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, str(SERVERS / "zero_latency_server.py"), "--port", str(port), "--tokens", str(tokens)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    assert proc.stdout is not None
    proc.stdout.readline()  # "zero-latency endpoint on ..." once it listens
    return proc


async def bare_aiohttp(url: str, concurrency: int, requests: int, stream: bool) -> dict[str, Any]:
    """The reference: a plain aiohttp loop posting one fixed body, reading each reply whole."""
    body = orjson.dumps({"model": "zero", "messages": [{"role": "user", "content": "hi"}], "stream": stream})
    left = min(1000, requests)
    latencies: list[int] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, headers={"Content-Type": "application/json"}) as s:

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                t = time.perf_counter_ns()
                async with s.post(url + "/v1/chat/completions", data=body) as r:
                    async for _ in r.content.iter_any():
                        pass
                latencies.append(time.perf_counter_ns() - t)

        await asyncio.gather(*(worker() for _ in range(concurrency)))  # warm-up, as the tool's
        left = requests
        latencies.clear()
        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
    lat = distribution(np.asarray(latencies) / 1e6)
    assert lat is not None
    return {"requests_per_s": requests / wall, "cpu_percent": 100 * cpu / wall,
            "latency_p50_ms": lat.p50, "latency_p99_ms": lat.p99}


def sessions(count: int) -> list[Session]:
    turn = Turn(("Say hello.",), ())
    return [Session(f"s{i}", (turn,), accumulate_history=False) for i in range(count)]


async def bench_tool(url: str, concurrency: int, requests: int, stream: bool) -> dict[str, Any]:
    settings = BenchSettings(url=url, dataset="(in memory)", concurrency=concurrency, request_count=requests,
                             warmup_requests=min(1000, requests), stream=stream, max_records=requests)
    out = await run_benchmark(settings, sessions(1000), None, console=Console(quiet=True), plots=False)
    s = out.summary
    m, t, c = s["metrics"], s["totals"], s["client"]
    ttft = m["ttft_ms"] or {}
    return {
        "requests_per_s": t["request_throughput"],
        "errors": t["errors"],
        "ttft_p50_ms": ttft.get("p50"), "ttft_p99_ms": ttft.get("p99"),
        "latency_p50_ms": m["request_latency_ms"]["p50"], "latency_p99_ms": m["request_latency_ms"]["p99"],
        "send_lag_p50_ms": c["send_lag_ms"]["p50"], "send_lag_p99_ms": c["send_lag_ms"]["p99"],
        "loop_lag_p99_ms": (c["loop_lag_ms"] or {}).get("p99"),
        "cpu_percent": c["cpu_percent"], "warnings": c["warnings"],
    }


def _f(value: Any, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    server = start_server(port, args.tokens)
    url = f"http://127.0.0.1:{port}"
    rows: dict[str, Any] = {}
    try:
        for stream in (True, False):
            mode = "stream" if stream else "no-stream"
            c = args.concurrency
            rows[f"bare aiohttp, {mode}, c={c}"] = await bare_aiohttp(url, c, args.requests, stream)
            rows[f"mmgate bench, {mode}, c={c}"] = await bench_tool(url, c, args.requests, stream)
        # Timing fidelity without queueing: one request at a time.
        n = min(args.requests, max(1000, args.requests // 10))
        rows["bare aiohttp, stream, c=1"] = await bare_aiohttp(url, 1, n, True)
        rows["mmgate bench, stream, c=1"] = await bench_tool(url, 1, n, True)
    finally:
        server.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=5)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description="client-side ceiling and timing overhead of mmgate bench")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=8, help="content chunks per streamed reply")
    parser.add_argument("--out", default="results/bench_fidelity.json")
    args = parse_args(parser, QUICK)
    install_uvloop()
    rows = asyncio.run(main_async(args))
    header = (f"{'client':<30}{'req/s':>10}{'TTFT p50':>10}{'TTFT p99':>10}{'lat p50':>10}{'lat p99':>10}"
              f"{'send p99':>10}{'loop p99':>10}{'CPU %':>8}")
    print(f"zero-latency endpoint, concurrency {args.concurrency}, {args.requests:,} requests, "
          f"{args.tokens} tokens/reply; times in ms")
    print(header)
    for name, r in rows.items():
        print(f"{name:<30}{_f(r['requests_per_s'], 0):>10}{_f(r.get('ttft_p50_ms')):>10}{_f(r.get('ttft_p99_ms')):>10}"
              f"{_f(r.get('latency_p50_ms')):>10}{_f(r.get('latency_p99_ms')):>10}{_f(r.get('send_lag_p99_ms')):>10}"
              f"{_f(r.get('loop_lag_p99_ms')):>10}{_f(r['cpu_percent'], 0):>8}")
    result = {
        "benchmark": "bench_fidelity", "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "python": platform.python_version(), "cpus": os.cpu_count(), "concurrency": args.concurrency,
        "requests": args.requests, "tokens": args.tokens, "rows": rows,
    }
    write_results(args.out, result)


if __name__ == "__main__":
    main()
