"""Does one very large request body stall the gateway's event loop? On loopback.

One ``mmgate serve`` process in front of one ``mmgate sim`` process (a vLLM stand-in, fast timing).
A *large request* is one chat turn of ``--images`` data-URL PNGs of noise, ~``--mb`` MB of JSON in
all (new images each time, so they are decoded: ``fresh``) or the same body again (its images
cached: ``repeat``, where only the JSON work is left). While it is sent, answered and read, a
probe asks ``GET /health`` every 5 ms over its own keep-alive connection and records each answer's
latency; the largest of them is the stall. Rounds alternate the two kinds; medians over rounds.

    .venv/bin/python benchmarks/regression/large_body.py --out bench-out/large_body.json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from PIL import Image

from benchmarks._procs import cpu_seconds, free_port, start, stop
from benchmarks._run import parse_args, write_results

MODEL = "mmgate-sim-vl"
QUICK = {"images": 2, "mb": 1.0, "rounds": 1}


def noise_png_url(side: int, seed: int) -> str:
    rng = __import__("random").Random(seed)
    img = Image.frombytes("RGB", (side, side), rng.randbytes(side * side * 3))
    buf = io.BytesIO()
    img.save(buf, "PNG", compress_level=0)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def large_body(images: int, mb: float, seed: int) -> bytes:
    side = int(((mb * 1e6 / images) * 3 / 4 / 3) ** 0.5)  # base64 of an uncompressed RGB PNG
    parts = [{"type": "image_url", "image_url": {"url": noise_png_url(side, seed * 1000 + i)}} for i in range(images)]
    return orjson.dumps({"model": MODEL, "max_tokens": 2,
                         "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}, *parts]}]})


async def probe(s: aiohttp.ClientSession, url: str, stop_event: asyncio.Event, out: list[float]) -> None:
    """/health every 5 ms (from the start of one ask to the next), each latency into ``out``."""
    while not stop_event.is_set():
        started = time.perf_counter()
        async with s.get(url + "/health") as r:
            await r.read()
        out.append(time.perf_counter() - started)
        await asyncio.sleep(max(0.0, 0.005 - (time.perf_counter() - started)))


async def one_round(url: str, body: bytes, gateway_pid: int) -> dict[str, Any]:
    latencies: list[float] = []
    stop_event = asyncio.Event()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as probe_s, \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as big_s:
        async with probe_s.get(url + "/health") as r:  # the probe's connection, open before
            await r.read()
        prober = asyncio.create_task(probe(probe_s, url, stop_event, latencies))
        await asyncio.sleep(0.3)
        baseline = list(latencies)
        cpu0 = cpu_seconds(gateway_pid)
        started = time.perf_counter()
        async with big_s.post(url + "/v1/chat/completions", data=body,
                              headers={"Content-Type": "application/json"}) as r:
            await r.read()
            status = r.status
        elapsed = time.perf_counter() - started
        cpu = cpu_seconds(gateway_pid) - cpu0
        await asyncio.sleep(0.2)
        stop_event.set()
        await prober
    during = latencies[len(baseline):]
    ms = sorted(x * 1000 for x in during)
    return {"status": status, "large_request_s": round(elapsed, 3), "gateway_cpu_s": round(cpu, 3),
            "health_max_ms": round(ms[-1], 1), "health_p50_ms": round(statistics.median(ms), 1),
            "health_probes": len(ms), "health_baseline_max_ms": round(max(baseline) * 1000, 1)}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    sim_port = free_port()
    sim = start(["sim", "--port", str(sim_port), "--speedup", "1000"], sim_port)
    out: dict[str, Any] = {"images": args.images, "rounds": {}}
    variants = dict(v.split("=", 1) for v in args.variant) or {"gateway": ""}
    gateways: dict[str, Any] = {}
    try:
        for name, pythonpath in variants.items():  # each variant its own gateway, same engine
            port = free_port()
            saved = os.environ.get("PYTHONPATH")
            if pythonpath:
                os.environ["PYTHONPATH"] = pythonpath  # this gateway runs that tree's mmgate
            try:
                gateways[name] = (start(["serve", "--port", str(port), "--backend", f"vllm=http://127.0.0.1:{sim_port}",
                                         "--log-level", "warning", *args.gateway_args], port),
                                  f"http://127.0.0.1:{port}")
            finally:
                if saved is None:
                    os.environ.pop("PYTHONPATH", None)
                else:
                    os.environ["PYTHONPATH"] = saved
        print("gateways:", {name: gw.pid for name, (gw, _) in gateways.items()}, file=sys.stderr, flush=True)
        bodies = [large_body(args.images, args.mb, r) for r in range(args.rounds)]
        out["body_mb"] = round(len(bodies[0]) / 1e6, 1)
        for gw, url in gateways.values():
            await one_round(url, large_body(2, 1, 10_000), gw.pid)  # warm-up
        for r, body in enumerate(bodies):  # variants alternate; fresh images, then the same body again
            for name, (gw, url) in gateways.items():
                for kind in ("fresh", "repeat"):
                    key = f"{name} {kind}"
                    out["rounds"].setdefault(key, []).append(await one_round(url, body, gw.pid))
                    print(f"round {r + 1} {key}: {out['rounds'][key][-1]}", file=sys.stderr, flush=True)
    finally:
        for gw, _ in gateways.values():
            stop(gw)
        stop(sim)
    out["summary"] = {kind: {k: statistics.median(x[k] for x in rs) for k in rs[0] if k != "status"}
                      | {"statuses": sorted({x["status"] for x in rs})} for kind, rs in out["rounds"].items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=50, help="images in the large request")
    parser.add_argument("--mb", type=float, default=100, help="size of the large request's body, MB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=PYTHONPATH",
                        help="a gateway running the mmgate found on PYTHONPATH (repeatable; rounds alternate)")
    parser.add_argument("--gateway-args", nargs=argparse.REMAINDER, default=[],
                        help="extra flags for mmgate serve (last on the line)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parse_args(parser, QUICK)
    out = asyncio.run(run(args))
    print(f"large body: {out['body_mb']} MB, {args.images} data-URL images; medians over {args.rounds} rounds")
    print(f"{'kind':16s} {'/health max ms':>15s} {'/health p50 ms':>15s} {'large req s':>12s} {'gw CPU s':>9s}")
    for kind, s in out["summary"].items():
        print(f"{kind:16s} {s['health_max_ms']:15.1f} {s['health_p50_ms']:15.1f} {s['large_request_s']:12.3f} "
              f"{s['gateway_cpu_s']:9.3f}  statuses {s['statuses']}")
    if args.out:
        write_results(args.out, out)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
