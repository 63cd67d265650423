"""The gateway's CPU per text request: chat completions versus the passthrough endpoints.

A zero-latency endpoint (``zero_latency_server.py``, its own process) stands behind one gateway
(its own process). The same number of text requests is sent to each route, at a fixed concurrency,
taking turns, and the gateway process's CPU time per request is read from /proc, so the client's and the
backend's CPU do not count. The passthrough rows should cost no more than the chat rows: they
parse the body once (for ``model``) and forward it without a copy.

    .venv/bin/python benchmarks/regression/passthrough_cost.py --requests 3000 --concurrency 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import aiohttp

from benchmarks._procs import ROOT, SERVERS, cpu_seconds, free_port, start, stop
from benchmarks._run import parse_args, write_results
from benchmarks._table import Column, print_table

MODEL = "zero"
PROMPT = "Summarise the plot of a short story about a lighthouse keeper. " * 4
ROWS: dict[str, tuple[str, dict[str, object]]] = {
    "chat": ("/v1/chat/completions", {"model": MODEL, "max_tokens": 16, "stream": False,
                                      "messages": [{"role": "user", "content": PROMPT}]}),
    "chat (stream)": ("/v1/chat/completions", {"model": MODEL, "max_tokens": 16, "stream": True,
                                               "messages": [{"role": "user", "content": PROMPT}]}),
    "completions": ("/v1/completions", {"model": MODEL, "max_tokens": 16, "stream": False, "prompt": PROMPT}),
    "completions (stream)": ("/v1/completions", {"model": MODEL, "max_tokens": 16, "stream": True,
                                                 "prompt": PROMPT}),
    "tokenize": ("/tokenize", {"model": MODEL, "stream": False, "prompt": PROMPT}),
    "embeddings": ("/v1/embeddings", {"model": MODEL, "stream": False, "input": [PROMPT] * 4}),
}
QUICK = {"requests": 12, "concurrency": 2, "rounds": 1}
WARM_UP = 200  # requests per row before the measured rounds


async def drive(url: str, body: bytes, requests: int, concurrency: int) -> None:
    queue = iter(range(requests))
    async with aiohttp.ClientSession() as session:
        async def worker() -> None:
            for _ in queue:
                async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{url} answered {r.status}")

        await asyncio.gather(*(worker() for _ in range(concurrency)))


async def measure(base: str, pid: int, requests: int, concurrency: int, rounds: int) -> dict[str, float]:
    """CPU µs per request of each row; the rows take turns, ``rounds`` times, so a machine whose
    load drifts during the run weighs on every row alike."""
    raws = {name: (base + path, json.dumps(body).encode()) for name, (path, body) in ROWS.items()}
    for url, raw in raws.values():
        await drive(url, raw, min(WARM_UP, requests), concurrency)
    cpu = dict.fromkeys(raws, 0.0)
    per_round = max(1, requests // rounds)
    for _ in range(rounds):
        for name, (url, raw) in raws.items():
            before = cpu_seconds(pid)
            await drive(url, raw, per_round, concurrency)
            cpu[name] += cpu_seconds(pid) - before
    return {name: seconds / (per_round * rounds) * 1e6 for name, seconds in cpu.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", default=str(ROOT / "build" / "passthrough_cost.json"))
    args = parse_args(parser, QUICK)
    zero_port, gw_port = free_port(), free_port()
    zero = start(["--port", str(zero_port)], zero_port, health="/v1/models",
                 command=[sys.executable, str(SERVERS / "zero_latency_server.py")])
    gw = start(["serve", "--port", str(gw_port), "--backend", f"vllm=http://127.0.0.1:{zero_port}"], gw_port)
    try:
        result = asyncio.run(measure(f"http://127.0.0.1:{gw_port}", gw.pid, args.requests, args.concurrency,
                                    args.rounds))
    finally:
        stop(gw)
        stop(zero)
    print_table([Column("route", 24, lambda r: r["route"], left=True),
                 Column("µs CPU/request", 16, lambda r: f"{r['micros']:.1f}")],
                [{"route": name, "micros": micros} for name, micros in result.items()])
    write_results(args.out, {"requests": args.requests, "concurrency": args.concurrency,
                             "cpu_us_per_request": result})


if __name__ == "__main__":
    main()
