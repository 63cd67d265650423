"""mmgate's data path side by side with vllm-router (Rust), in one run, against one fast backend.

One zero-latency OpenAI-compatible backend (``zero_latency_server.py``) on loopback; in front of it
vllm-router (from PyPI, in a venv of its own that this script makes once under ``build/``) and one
or more mmgate source trees (``--mmgate NAME=SRC``: e.g. today's tree and a checkout of an earlier
commit, so "before" and "after" are measured in the same run on the same machine). The same
client sends, for each row:

* ``text-stream`` / ``text-whole``: a short chat request, streamed / not;
* ``image-relay``: a ~1 MiB JPEG (the same one each time, no uuid) through mmgate's ``openai``
  backend, which must send the bytes on every request (vllm-router relays them too);
* ``image-reuse``: the same through mmgate's ``vllm`` backend with ``--reuse auto``, which sends the
  repeat as a cache-only reference (vllm-router still relays the bytes).

Beside them runs ``bare_relay.py`` (``bare-relay``): aiohttp's server and client relaying the
bytes and doing nothing else, the floor of the HTTP stack mmgate is built on, so mmgate's own work
reads off as its CPU over the relay's (``CPU - bare``). For each tree, ``<tree>-own-server`` (text rows) is ``own_server_floor.py``: that tree's chat
pipeline on the same framework-free server, without the observer, guard and tracking.

Added latency: 1 request in flight, the targets interleaved request by request (direct, each
proxy; each round in a new order), the median over rounds of (proxy - direct). CPU per request: ``--cpu-requests`` requests at
``--concurrency``, proxy by proxy, the proxy's process tree's CPU time (``/proc``, children and
threads included) over the requests. Ratios are mmgate's over vllm-router's.

    .venv/bin/python benchmarks/regression/router_compare.py --mmgate now=src --rounds 400 --cpu-requests 2000
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks._procs import MMGATE, ROOT, SERVERS, free_port, stop, tree_cpu_s, wait_up
from benchmarks._run import parse_args, write_results
from benchmarks._table import Column, render
from benchmarks.regression.gateway_overhead import one_mib_jpeg

ROUTER_VERSION = "0.1.17"
ROWS = ("text-stream", "text-whole", "image-relay", "image-reuse")
TEXT_ROWS = ROWS[:2]
QUICK = {"rounds": 4, "cpu_requests": 8, "image_cpu_requests": 4, "concurrency": 2}


def router_binary(venv: Path) -> Path:
    """vllm-router from PyPI in ``venv`` (made and installed the first time)."""
    binary = venv / "bin" / "vllm-router"
    if not binary.exists():
        print(f"installing vllm-router=={ROUTER_VERSION} into {venv} (once)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"vllm-router=={ROUTER_VERSION}"], check=True)
    return binary


@dataclass
class Target:
    name: str
    url: str
    proc: subprocess.Popen[bytes] | None = None
    latencies: dict[str, list[float]] = field(default_factory=dict)
    cpu_ms: dict[str, float] = field(default_factory=dict)


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    wait_up(url + "/v1/models", proc, timeout)


def wait_health(url: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """Wait until ``url``/health answers (the bare relay serves no /v1/models)."""
    wait_up(url + "/health", proc, timeout)


def start_mmgate(src: Path, kind: str, backend: str, extra: list[str]) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(src.resolve())}
    args = ["serve", "--port", str(port), "--backend", f"{kind}={backend}", "--log-level", "warning",
            "--allowed-private", "127.0.0.1", *extra]
    proc = subprocess.Popen([*MMGATE, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc)
    return url, proc


def named(comm: str) -> set[int]:
    """Pids of the processes whose name (``/proc/PID/comm``) is ``comm``."""
    out = set()
    for entry in Path("/proc").glob("[0-9]*/comm"):
        try:
            if entry.read_text().strip() == comm:
                out.add(int(entry.parent.name))
        except (OSError, ValueError):
            continue
    return out


def start_router(binary: Path, backend: str) -> tuple[str, subprocess.Popen[bytes], list[int]]:
    """vllm-router in front of ``backend``: its URL, its launcher, and every pid that serves (the
    launcher starts the Rust router as a process of its own, ``vllm::router``, which init adopts:
    it is no child of the launcher, so it is found by name, and its CPU counted with it)."""
    before = named("vllm::router")
    port = free_port()
    proc = subprocess.Popen(
        [str(binary), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", backend,
         "--policy", "round_robin", "--log-level", "error", "--max-payload-size", str(64 * 1024 * 1024)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc)
    return url, proc, [proc.pid, *sorted(named("vllm::router") - before)]


def bodies(image: bytes) -> dict[str, bytes]:
    text = [{"role": "user", "content": "Summarise the plot of a short story about a lighthouse keeper."}]
    url = "data:image/jpeg;base64," + base64.b64encode(image).decode()
    with_image = [{"role": "user", "content": [{"type": "text", "text": "What is in this image?"},
                                               {"type": "image_url", "image_url": {"url": url}}]}]
    return {
        "text-stream": json.dumps({"model": "zero", "stream": True, "messages": text}).encode(),
        "text-whole": json.dumps({"model": "zero", "stream": False, "messages": text}).encode(),
        "image-relay": json.dumps({"model": "zero", "stream": True, "messages": with_image}).encode(),
        "image-reuse": json.dumps({"model": "zero", "stream": True, "messages": with_image}).encode(),
    }


async def one(http: aiohttp.ClientSession, url: str, body: bytes) -> float:
    started = time.perf_counter()
    async with http.post(url + "/v1/chat/completions", data=body,
                         headers={"Content-Type": "application/json", "x-session-id": "bench"}) as r:
        await r.read()
        if r.status != 200:
            raise RuntimeError(f"{url}: HTTP {r.status}")
    return time.perf_counter() - started


async def latency(targets: list[Target], urls: dict[str, dict[str, str]], body: bytes, row: str, rounds: int) -> None:
    async with aiohttp.ClientSession() as http:
        for t in targets:  # warm: connections, caches
            for _ in range(5):
                await one(http, urls[t.name][row], body)
        for t in targets:
            t.latencies[row] = []
        # Each round in a new order: a target's place in the round moves its latency by tens of
        # µs (what ran just before it on the two cores), so a fixed order would bias the ratios.
        order = list(targets)
        shuffle = random.Random(row).shuffle
        for _ in range(rounds):
            shuffle(order)
            for t in order:
                t.latencies[row].append(await one(http, urls[t.name][row], body))


async def cpu(url: str, body: bytes, requests: int, concurrency: int, pids: list[int]) -> float:
    """CPU milliseconds per request of the processes ``pids`` over ``requests`` requests."""
    async with aiohttp.ClientSession() as http:
        for _ in range(20):
            await one(http, url, body)
        before = sum(tree_cpu_s(p) for p in pids)
        left = requests

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await one(http, url, body)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return 1000 * (sum(tree_cpu_s(p) for p in pids) - before) / requests


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mmgate", action="append", default=[], metavar="NAME=SRC",
                   help="an mmgate source tree to run (repeatable; default now=<repo>/src)")
    p.add_argument("--rounds", type=int, default=300, help="interleaved latency rounds per row")
    p.add_argument("--cpu-requests", type=int, default=1500)
    p.add_argument("--image-cpu-requests", type=int, default=300)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--router-venv", type=Path, default=ROOT / "build" / "vllm-router-venv")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "router_compare.json")
    args = parse_args(p, QUICK)
    trees = [spec.split("=", 1) for spec in args.mmgate] or [["now", str(ROOT / "src")]]
    rows = args.rows.split(",")
    binary = router_binary(args.router_venv)
    backend_port = free_port()
    backend = subprocess.Popen([sys.executable, str(SERVERS / "zero_latency_server.py"),
                                "--port", str(backend_port), "--tokens", "8"])
    backend_url = f"http://127.0.0.1:{backend_port}"
    procs: list[subprocess.Popen[bytes]] = [backend]
    targets = [Target("direct", backend_url), Target("vllm-router", ""), Target("bare-relay", "")]
    urls: dict[str, dict[str, str]] = {"direct": dict.fromkeys(ROWS, backend_url)}
    pids: dict[str, dict[str, list[int]]] = {}
    extra_pids: list[int] = []
    try:
        wait_ready(backend_url, backend)
        router_url, router_proc, router_pids = start_router(binary, backend_url)
        procs.append(router_proc)
        extra_pids = router_pids[1:]
        urls["vllm-router"] = dict.fromkeys(ROWS, router_url)
        pids["vllm-router"] = {row: list(router_pids) for row in ROWS}
        bare_port = free_port()
        bare = subprocess.Popen([sys.executable, str(SERVERS / "bare_relay.py"), str(bare_port),
                                 str(backend_port)])
        procs.append(bare)
        urls["bare-relay"] = dict.fromkeys(ROWS, f"http://127.0.0.1:{bare_port}")
        pids["bare-relay"] = {row: [bare.pid] for row in ROWS}
        wait_health(urls["bare-relay"]["text-stream"], bare)
        for name, src in trees:
            relay_url, relay = start_mmgate(Path(src), "openai", backend_url, [])
            reuse_url, reuse = start_mmgate(Path(src), "vllm", backend_url, ["--reuse", "auto"])
            procs += [relay, reuse]
            targets.append(Target(f"mmgate-{name}", ""))
            urls[f"mmgate-{name}"] = {"text-stream": relay_url, "text-whole": relay_url,
                                      "image-relay": relay_url, "image-reuse": reuse_url}
            pids[f"mmgate-{name}"] = {"text-stream": [relay.pid], "text-whole": [relay.pid],
                                      "image-relay": [relay.pid], "image-reuse": [reuse.pid]}
            own_port = free_port()
            own = subprocess.Popen([sys.executable, str(SERVERS / "own_server_floor.py"), str(own_port),
                                    backend_url], env={**os.environ, "PYTHONPATH": str(Path(src).resolve())})
            procs.append(own)
            wait_health(f"http://127.0.0.1:{own_port}", own)
            targets.append(Target(f"mmgate-{name}-own-server", ""))
            urls[f"mmgate-{name}-own-server"] = dict.fromkeys(TEXT_ROWS, f"http://127.0.0.1:{own_port}")
            pids[f"mmgate-{name}-own-server"] = {row: [own.pid] for row in TEXT_ROWS}
        payloads = bodies(one_mib_jpeg())
        for row in rows:
            rounds = args.rounds if row.startswith("text") else min(args.rounds, max(50, args.rounds // 4))
            present = [t for t in targets if row in urls[t.name]]
            asyncio.run(latency(present, urls, payloads[row], row, rounds))
            n = args.cpu_requests if row.startswith("text") else args.image_cpu_requests
            for t in present[1:]:
                t.cpu_ms[row] = asyncio.run(cpu(urls[t.name][row], payloads[row], n, args.concurrency,
                                                pids[t.name][row]))
            print(f"  {row} done", file=sys.stderr)
    finally:
        for proc in reversed(procs):
            stop(proc)
        for pid in extra_pids:  # the router process the launcher left behind
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
    direct = targets[0]
    table: list[dict[str, str]] = []
    result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "rows": {}}
    router = targets[1]
    for row in rows:
        entry: dict[str, Any] = {}
        present = [t for t in targets if row in urls[t.name]]
        for t in present[1:]:
            added = [x - d for x, d in zip(t.latencies[row], direct.latencies[row], strict=True)]
            entry[t.name] = {"added_p50_ms": 1000 * statistics.median(added), "cpu_ms_per_request": t.cpu_ms[row],
                             "p50_ms": 1000 * statistics.median(t.latencies[row])}
        for t in (t for t in present if t.name.startswith("mmgate-")):
            mine = entry[t.name]
            mine["cpu_over_bare_ms"] = mine["cpu_ms_per_request"] - entry["bare-relay"]["cpu_ms_per_request"]
        for t in present[2:]:
            mine, theirs = entry[t.name], entry[router.name]
            mine["added_ratio"] = mine["added_p50_ms"] / theirs["added_p50_ms"] if theirs["added_p50_ms"] > 0 else None
            # None where the router's CPU read as 0 (a few requests, /proc's 10 ms ticks).
            mine["cpu_ratio"] = mine["cpu_ms_per_request"] / theirs["cpu_ms_per_request"] \
                if theirs["cpu_ms_per_request"] > 0 else None
        entry["direct_p50_ms"] = 1000 * statistics.median(direct.latencies[row])
        result["rows"][row] = entry
        for t in present[1:]:
            e = entry[t.name]
            table.append({"row": row, "proxy": t.name, "added": f"{e['added_p50_ms']:.3f}",
                          "cpu": f"{e['cpu_ms_per_request']:.3f}",
                          "added_ratio": "" if e.get("added_ratio") is None else f"{e['added_ratio']:.2f}",
                          "cpu_ratio": "" if e.get("cpu_ratio") is None else f"{e['cpu_ratio']:.2f}",
                          "over_bare": f"{e['cpu_over_bare_ms']:.3f}" if "cpu_over_bare_ms" in e else ""})
    columns = [Column("row", 13, lambda r: r["row"], left=True), Column("proxy", 22, lambda r: r["proxy"], left=True),
               Column("added p50 ms", 14, lambda r: r["added"]), Column("CPU ms/req", 12, lambda r: r["cpu"]),
               Column("added/router", 14, lambda r: r["added_ratio"]), Column("CPU/router", 12, lambda r: r["cpu_ratio"]),
               Column("CPU - bare", 12, lambda r: r["over_bare"])]
    print(render(columns, table))
    write_results(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
