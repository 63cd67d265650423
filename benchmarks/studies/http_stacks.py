"""HTTP server stacks side by side: the same streamed relay on aiohttp, uvicorn (httptools) and granian.

Which maintained server should mmgate's one HTTP stack be? Each candidate serves the same minimal
app — ``POST /v1/chat/completions``: read the body, send it to one zero-latency backend
(``zero_latency_server.py``) on aiohttp's client, relay the reply (an SSE stream chunk by chunk,
the last chunk with the end; a whole body at once) — and nothing else:

* ``aiohttp``: ``bare_relay.py`` (aiohttp.web on uvloop, the head held for the first chunk);
* ``uvicorn``: ``asgi_relay.py``, a plain ASGI app, under uvicorn with ``http="httptools"``, ``loop="uvloop"``;
* ``granian``: the same ASGI app under granian (``--interface asgi --loop uvloop``, one worker);

beside ``vllm-router`` (Rust, the aim) and ``mmgate`` itself (``mmgate serve``, one ``openai``
backend), so the stacks' floors read against both. uvicorn and granian are measurement-only: they
are not mmgate dependencies (``pip install uvicorn granian``); a candidate not installed is skipped
with a line saying so.

Latency: one request in flight, the targets interleaved request by request, each round in a new
order; per target the round trip's p50 and p99, and the added p50 (the median of target - direct,
paired in the round). CPU per request: ``--cpu-requests`` requests at ``--concurrency``, target by
target in a rotating order, ``--cpu-rounds`` times; the median over rounds of the CPU time of the
server's process tree (``/proc``, children and threads included) over the requests.

    .venv/bin/python benchmarks/studies/http_stacks.py --rounds 2000 --cpu-requests 2000 --cpu-rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks._procs import ROOT, free_port, stop
from benchmarks._table import Column, render
from benchmarks.regression.router_compare import (
    cpu as cpu_ms,
)
from benchmarks.regression.router_compare import (
    one,
    router_binary,
    start_mmgate,
    start_router,
    wait_health,
    wait_ready,
)
from benchmarks.servers.asgi_relay import BACKEND_ENV

HERE = Path(__file__).resolve().parents[1] / "servers"
ROWS = ("text-stream", "text-whole")
TEXT = [{"role": "user", "content": "Summarise the plot of a short story about a lighthouse keeper."}]


def commands(port: int) -> dict[str, list[str] | None]:
    """Each candidate's command line, or None where it is not installed."""
    granian = str(Path(sys.executable).parent / "granian")
    return {
        "aiohttp": [sys.executable, str(HERE / "bare_relay.py"), str(port)],
        "uvicorn": [sys.executable, str(HERE / "asgi_relay.py"), "--uvicorn", str(port)]
        if importlib.util.find_spec("uvicorn") and importlib.util.find_spec("httptools") else None,
        "granian": [granian, "--interface", "asgi", "--loop", "uvloop", "--workers", "1", "--host", "127.0.0.1",
                    "--port", str(port), "--no-access-log", "--log-level", "warning", "--no-ws",
                    "--working-dir", str(HERE), "asgi_relay:app"]
        if importlib.util.find_spec("granian") and Path(granian).exists() else None,
    }


def start_candidate(name: str, backend_port: int) -> tuple[str, subprocess.Popen[bytes]] | None:
    port = free_port()
    cmd = commands(port)[name]
    if cmd is None:
        print(f"skipped {name}: not installed (.venv/bin/pip install uvicorn granian)", file=sys.stderr)
        return None
    if name == "aiohttp":
        cmd = [*cmd, str(backend_port)]
    env = {**os.environ, BACKEND_ENV: f"http://127.0.0.1:{backend_port}"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_health(url, proc)
    return url, proc


async def latencies(urls: dict[str, str], body: bytes, rounds: int, seed: str) -> dict[str, list[float]]:
    """Round trips, one in flight, the targets interleaved request by request in a new order each round."""
    out: dict[str, list[float]] = {name: [] for name in urls}
    async with aiohttp.ClientSession() as http:
        for url in urls.values():  # warm: connections, first calls
            for _ in range(20):
                await one(http, url, body)
        order = list(urls)
        shuffle = random.Random(seed).shuffle
        for _ in range(rounds):
            shuffle(order)
            for name in order:
                out[name].append(await one(http, urls[name], body))
    return out


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2000, help="interleaved latency rounds per row")
    p.add_argument("--cpu-requests", type=int, default=2000, help="requests per CPU measurement")
    p.add_argument("--cpu-rounds", type=int, default=3, help="CPU measurements per target and row, order rotating")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--stacks", default="aiohttp,uvicorn,granian")
    p.add_argument("--no-mmgate", action="store_true", help="leave mmgate itself out")
    p.add_argument("--router-venv", type=Path, default=ROOT / "build" / "vllm-router-venv")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "http_stacks.json")
    args = p.parse_args()
    backend_port = free_port()
    backend_url = f"http://127.0.0.1:{backend_port}"
    backend = subprocess.Popen([sys.executable, str(HERE / "zero_latency_server.py"), "--port", str(backend_port),
                                "--tokens", "8"])
    procs: list[subprocess.Popen[bytes]] = [backend]
    urls: dict[str, str] = {"direct": backend_url}
    pids: dict[str, list[int]] = {}
    router_extra: list[int] = []
    rows = args.rows.split(",")
    result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "load_before": os.getloadavg(),
                              "rows": {}}
    try:
        wait_ready(backend_url, backend)
        router_url, router_proc, router_pids = start_router(router_binary(args.router_venv), backend_url)
        procs.append(router_proc)
        router_extra = router_pids[1:]
        urls["vllm-router"], pids["vllm-router"] = router_url, router_pids
        for name in args.stacks.split(","):
            started = start_candidate(name, backend_port)
            if started is not None:
                urls[name], proc = started
                procs.append(proc)
                pids[name] = [proc.pid]
        if not args.no_mmgate:
            urls["mmgate"], proc = start_mmgate(ROOT / "src", "openai", backend_url, [])
            procs.append(proc)
            pids["mmgate"] = [proc.pid]
        for row in rows:
            body = json.dumps({"model": "zero", "stream": row == "text-stream", "messages": TEXT}).encode()
            lat = asyncio.run(latencies(urls, body, args.rounds, row))
            cpu: dict[str, list[float]] = {name: [] for name in pids}
            order = list(pids)
            for r in range(args.cpu_rounds):
                for name in order[r % len(order):] + order[:r % len(order)]:
                    cpu[name].append(asyncio.run(cpu_ms(urls[name], body, args.cpu_requests, args.concurrency,
                                                        pids[name])))
            entry: dict[str, Any] = {}
            for name in pids:
                added = [x - d for x, d in zip(lat[name], lat["direct"], strict=True)]
                entry[name] = {"p50_ms": 1000 * statistics.median(lat[name]), "p99_ms": 1000 * pct(lat[name], 99),
                               "added_p50_ms": 1000 * statistics.median(added),
                               "cpu_ms_per_request": statistics.median(cpu[name]), "cpu_ms_rounds": cpu[name]}
            router = entry["vllm-router"]
            for e in entry.values():
                e["added_ratio"] = e["added_p50_ms"] / router["added_p50_ms"] if router["added_p50_ms"] > 0 else None
                e["cpu_ratio"] = e["cpu_ms_per_request"] / router["cpu_ms_per_request"] \
                    if router["cpu_ms_per_request"] > 0 else None
            entry["direct"] = {"p50_ms": 1000 * statistics.median(lat["direct"]),
                               "p99_ms": 1000 * pct(lat["direct"], 99)}
            result["rows"][row] = entry
            print(f"  {row} done (load {os.getloadavg()[0]:.2f})", file=sys.stderr)
    finally:
        for proc in reversed(procs):
            stop(proc)
        for pid in router_extra:  # the Rust router the launcher left behind
            try:
                os.kill(pid, 15)
            except OSError:
                pass
    result["load_after"] = os.getloadavg()
    table = [{"row": row, "stack": name, **e} for row, entry in result["rows"].items()
             for name, e in entry.items() if name != "direct"]
    columns = [Column("row", 12, lambda r: r["row"], left=True), Column("stack", 12, lambda r: r["stack"], left=True),
               Column("p50 ms", 8, lambda r: f"{r['p50_ms']:.3f}"), Column("p99 ms", 8, lambda r: f"{r['p99_ms']:.3f}"),
               Column("added p50 ms", 13, lambda r: f"{r['added_p50_ms']:.3f}"),
               Column("CPU ms/req", 11, lambda r: f"{r['cpu_ms_per_request']:.3f}"),
               Column("added/router", 13, lambda r: "" if r["added_ratio"] is None else f"{r['added_ratio']:.2f}"),
               Column("CPU/router", 11, lambda r: "" if r["cpu_ratio"] is None else f"{r['cpu_ratio']:.2f}")]
    print(render(columns, table))
    for row, entry in result["rows"].items():
        print(f"{row}: direct p50 {entry['direct']['p50_ms']:.3f} ms, p99 {entry['direct']['p99_ms']:.3f} ms")
    print(f"load average before {result['load_before']}, after {result['load_after']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
