"""What the gateway adds: one client, one sim backend, direct versus through mmgate.

Runs a sim engine (zero modelled latency) and a gateway as separate processes on loopback, then
sends the same requests one at a time (low load), alternating direct and gateway, for:
text-only streaming, text-only non-streaming, and streaming with one ~1 MiB image (same image each
time, with a uuid as a multi-turn client would resend it, and without one: then the gateway
finds it by a hash of the base64 text).
Reports p50/p99 latency of each path, the added p50/p99, and the gateway process's CPU time per
request (from /proc, so the client's and the sim's CPU do not count). Text rows are repeated
through ``bare_relay.py`` (``_bare_relay``: aiohttp's server and client relaying bytes, nothing
else: the floor of the HTTP stack mmgate is built on).

    .venv/bin/python benchmarks/regression/gateway_overhead.py --requests 2000 --image-requests 300

``--baseline SRC`` compares two gateways instead, side by side: this tree's and the one whose
``src/`` is under SRC (a worktree of an earlier commit), both ``--log-level info`` (so this
tree's access log is on, written to a file) and without tracing, each request sent to one then
the other (the order alternating), for the same scenarios. With ``--trace`` this tree's gateway
exports its spans (``--otlp-traces-endpoint``) to ``otlp_sink.py``: ``--baseline . --trace`` is
the cost of tracing.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import aiohttp
from PIL import Image

from benchmarks._procs import ROOT, SERVERS, cpu_seconds, free_port, start, stop
from benchmarks._run import parse_args, write_results
from benchmarks._table import pct

MODEL = "mmgate-sim-vl"
QUICK = {"requests": 5, "image_requests": 3}


def one_mib_jpeg() -> bytes:
    """A noisy JPEG of about 1 MiB (noise does not compress)."""
    rng = random.Random(7)
    side = 900
    img = Image.frombytes("RGB", (side, side), bytes(rng.getrandbits(8) for _ in range(side * side * 3)))
    for quality in (95, 90, 85, 80, 70):
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=quality)
        if buf.tell() <= 1.1 * 1024 * 1024:
            break
    return buf.getvalue()


def bodies(image_bytes: bytes) -> dict[str, bytes]:
    text = {"role": "user", "content": "Summarise the plot of a short story about a lighthouse keeper."}
    data_url = "data:image/jpeg;base64," + base64.b64encode(image_bytes).decode()
    image_msg = {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in this image?"},
            {"type": "image_url", "image_url": {"url": data_url}, "uuid": "bench-image-1"},
        ],
    }
    image_no_uuid = {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in this image?"},
            {"type": "image_url", "image_url": {"url": data_url}},
        ],
    }
    common = {"model": MODEL, "max_tokens": 16}
    return {
        "text_stream": json.dumps({**common, "messages": [text], "stream": True}).encode(),
        "text_nonstream": json.dumps({**common, "messages": [text]}).encode(),
        "image_stream": json.dumps({**common, "messages": [image_msg], "stream": True}).encode(),
        "image_no_uuid_stream": json.dumps({**common, "messages": [image_no_uuid], "stream": True}).encode(),
    }


async def one(session: aiohttp.ClientSession, url: str, body: bytes) -> float:
    t0 = time.perf_counter_ns()
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
        await r.read()
        if r.status != 200:
            raise RuntimeError(f"{url}: HTTP {r.status}")
    return (time.perf_counter_ns() - t0) / 1e6


async def measure(direct: str, gateway: str, gw_pid: int, body: bytes, n: int) -> dict[str, float]:
    lat: dict[str, list[float]] = {"direct": [], "gateway": []}
    conn = aiohttp.TCPConnector(limit=4)
    async with aiohttp.ClientSession(connector=conn) as session:
        for _ in range(max(20, n // 10)):  # warm-up: connections, caches, JIT-free but lazy imports
            await one(session, direct, body)
            await one(session, gateway, body)
        c0 = cpu_seconds(gw_pid)
        for _ in range(n):
            lat["direct"].append(await one(session, direct, body))
            lat["gateway"].append(await one(session, gateway, body))
        await asyncio.sleep(0.05)  # let the gateway finish what it does after the last byte
        gw_cpu = cpu_seconds(gw_pid) - c0
    d50, d99 = pct(lat["direct"], 50), pct(lat["direct"], 99)
    g50, g99 = pct(lat["gateway"], 50), pct(lat["gateway"], 99)
    return {
        "requests": n,
        "direct_p50_ms": d50, "direct_p99_ms": d99,
        "gateway_p50_ms": g50, "gateway_p99_ms": g99,
        "added_p50_ms": g50 - d50, "added_p99_ms": g99 - d99,
        "added_mean_ms": statistics.fmean(lat["gateway"]) - statistics.fmean(lat["direct"]),
        "gateway_cpu_ms_per_request": 1000 * gw_cpu / n,
    }


async def measure_pair(a: str, a_pid: int, b: str, b_pid: int, body: bytes, n: int) -> dict[str, float]:
    """``n`` requests to each of two gateways, interleaved (the order alternating each round)."""
    lat: dict[str, list[float]] = {"a": [], "b": []}
    cpu = {"a": 0.0, "b": 0.0}
    conn = aiohttp.TCPConnector(limit=4)
    async with aiohttp.ClientSession(connector=conn) as session:
        for _ in range(max(20, n // 10)):
            await one(session, a, body)
            await one(session, b, body)
        for i in range(n):
            for key in ("ab" if i % 2 == 0 else "ba"):
                url, pid = (a, a_pid) if key == "a" else (b, b_pid)
                c0 = cpu_seconds(pid)
                lat[key].append(await one(session, url, body))
                cpu[key] += cpu_seconds(pid) - c0
    a50, b50 = statistics.median(lat["a"]), statistics.median(lat["b"])
    return {
        "requests": n, "a_p50_ms": a50, "a_p99_ms": pct(lat["a"], 99), "b_p50_ms": b50, "b_p99_ms": pct(lat["b"], 99),
        "p50_ratio": a50 / b50, "a_cpu_ms_per_request": 1000 * cpu["a"] / n, "b_cpu_ms_per_request": 1000 * cpu["b"] / n,
    }


def compare(baseline: str, args: argparse.Namespace) -> None:
    """This tree's gateway (a) against the one under ``baseline`` (b), side by side."""
    sim_port, a_port, b_port = free_port(), free_port(), free_port()
    sim = start(["sim", "--port", str(sim_port), "--speedup", "1000000"], sim_port)
    flags = ["--backend", f"vllm=http://127.0.0.1:{sim_port}", "--log-level", "info"]
    here = str(ROOT / "src")
    helpers = [sim]
    a_flags = []
    if args.trace:
        sink_port = free_port()
        helpers.append(start([str(sink_port)], sink_port,
                             command=[sys.executable, str(SERVERS / "otlp_sink.py")]))
        a_flags = ["--otlp-traces-endpoint", f"http://127.0.0.1:{sink_port}/v1/traces"]
    a = start(["serve", "--port", str(a_port), *flags, *a_flags], a_port, env={**os.environ, "PYTHONPATH": here})
    b = start(["serve", "--port", str(b_port), *flags], b_port,
              env={**os.environ, "PYTHONPATH": str(Path(baseline).resolve() / "src")})
    try:
        results = {}
        for name, body in bodies(one_mib_jpeg()).items():
            n = args.image_requests if name.startswith("image") else args.requests
            results[name] = asyncio.run(measure_pair(
                f"http://127.0.0.1:{a_port}/v1/chat/completions", a.pid,
                f"http://127.0.0.1:{b_port}/v1/chat/completions", b.pid, body, n))
    finally:
        for proc in (a, b, *helpers):
            stop(proc)
    tracing = "on" if args.trace else "off"
    print(f"a = this tree (access log on, tracing {tracing}); b = {baseline}; interleaved, one request at a time")
    print(f"{'scenario':<24}{'a p50':>9}{'b p50':>9}{'a/b p50':>9}{'a p99':>9}{'b p99':>9}{'a CPU/req':>11}{'b CPU/req':>11}")
    for name, r in results.items():
        print(f"{name:<24}{r['a_p50_ms']:>7.3f}ms{r['b_p50_ms']:>7.3f}ms{r['p50_ratio']:>9.3f}{r['a_p99_ms']:>7.3f}ms"
              f"{r['b_p99_ms']:>7.3f}ms{r['a_cpu_ms_per_request']:>9.3f}ms{r['b_cpu_ms_per_request']:>9.3f}ms")
    write_results(args.out, {"baseline": baseline, "trace": args.trace, "cpu_count": os.cpu_count(),
                             "results": results})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000, help="requests per text scenario and path")
    parser.add_argument("--image-requests", type=int, default=300, help="requests per image scenario and path")
    parser.add_argument("--out", default="results/gateway_overhead.json")
    parser.add_argument("--baseline", metavar="SRC", help="compare with the gateway of another source tree")
    parser.add_argument("--trace", action="store_true", help="with --baseline: this tree's gateway exports traces")
    args = parse_args(parser, QUICK)
    if args.baseline:
        compare(args.baseline, args)
        return

    sim_port, gw_port = free_port(), free_port()
    sim = start(["sim", "--port", str(sim_port), "--speedup", "1000000"], sim_port)
    backend = ["--backend", f"vllm=http://127.0.0.1:{sim_port}", "--log-level", "warning"]
    gw = start(["serve", "--port", str(gw_port), *backend], gw_port)
    bare_port = free_port()
    relay_script = [sys.executable, str(SERVERS / "bare_relay.py")]
    bare = start([str(bare_port), str(sim_port)], bare_port, command=relay_script)
    gw_off_port = free_port()
    gw_off = start(["serve", "--port", str(gw_off_port), "--reuse", "off", *backend], gw_off_port)
    try:
        image = one_mib_jpeg()
        direct = f"http://127.0.0.1:{sim_port}/v1/chat/completions"
        via = f"http://127.0.0.1:{gw_port}/v1/chat/completions"
        via_off = f"http://127.0.0.1:{gw_off_port}/v1/chat/completions"
        results = {}
        for name, body in bodies(image).items():
            if name.startswith("image"):
                # reuse off: the gateway relays the bytes every time (the relay cost); auto: the
                # repeat goes to the engine as a cache-only reference.
                results[name + "_reuse_off"] = asyncio.run(
                    measure(direct, via_off, gw_off.pid, body, args.image_requests)
                )
                results[name + "_reuse_auto"] = asyncio.run(measure(direct, via, gw.pid, body, args.image_requests))
            else:
                results[name] = asyncio.run(measure(direct, via, gw.pid, body, args.requests))
                # The same through the bare relay: the floor of the HTTP stack mmgate uses.
                via_bare = f"http://127.0.0.1:{bare_port}/v1/chat/completions"
                results[name + "_bare_relay"] = asyncio.run(measure(direct, via_bare, bare.pid, body, args.requests))
    finally:
        stop(gw)
        stop(gw_off)
        stop(bare)
        stop(sim)

    header = f"{'scenario':<24}{'direct p50':>11}{'gw p50':>9}{'added p50':>11}{'added p99':>11}{'gw CPU/req':>12}"
    print(f"image bytes: {len(image):,}; requests alternate direct/gateway, one at a time")
    print(header)
    for name, r in results.items():
        print(f"{name:<24}{r['direct_p50_ms']:>9.3f}ms{r['gateway_p50_ms']:>7.3f}ms{r['added_p50_ms']:>9.3f}ms"
              f"{r['added_p99_ms']:>9.3f}ms{r['gateway_cpu_ms_per_request']:>10.3f}ms")
    write_results(args.out, {"image_bytes": len(image), "cpu_count": os.cpu_count(), "results": results})


if __name__ == "__main__":
    main()
