"""UUID reuse on a sliding-window workload: what crosses the wire and what the engines process.

Agents and chat apps resend the conversation each turn: at turn t a session sends the last W
images (one new per turn). Four ways to run it, each on fresh processes (two sim engines — vLLM
stand-ins — behind one gateway, all on loopback):

* ``off``          gateway ``--reuse off``; the client sends every image with its bytes, no uuid
* ``auto``         gateway ``--reuse auto``; the same client (the gateway strips repeats itself)
* ``client-strip`` gateway ``--reuse off``; the client sends uuid + bytes once per session, then
                   cache-only references (what ``mmgate bench --uuid-and-strip`` does)
* ``uuid-resend``  gateway ``--reuse off``; the client labels images with uuids but resends bytes

Physical limit: each unique image of a session sent once and processed once. Reported: images and
bytes the engines received, images they processed (decoded + resized + normalised) and decoded on a
cache hit, heals, client bytes, TTFT and latency p50/p99.

    .venv/bin/python benchmarks/regression/reuse_sliding_window.py --sessions 8 --turns 12 --window 4
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import re
import time
import urllib.request
from typing import Any

import aiohttp

from benchmarks._chat import post_streamed
from benchmarks._images import seeded_jpeg
from benchmarks._procs import free_port, start, stop
from benchmarks._run import parse_args, write_results
from benchmarks._table import Column, pct, print_table

MODEL = "mmgate-sim-vl"
MODES = ("off", "auto", "client-strip", "uuid-resend")
QUICK = {"sessions": 2, "turns": 2, "image_size": 64, "sim_speedup": 1000.0, "modes": "auto"}


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:]+)(\{[^}]*\})? ([0-9.e+-]+)$", line)
        if m and not line.startswith("#"):
            out[m.group(1) + (m.group(2) or "")] = out.get(m.group(1) + (m.group(2) or ""), 0) + float(m.group(3))
    return out


def total(metrics: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in metrics.items() if k.startswith(prefix))


async def run_session(
    session: aiohttp.ClientSession, url: str, sid: int, mode: str, images: list[str], args: argparse.Namespace,
    out: dict[str, list[float]],
) -> None:
    sent_uuids: set[str] = set()
    for t in range(args.turns):
        parts: list[dict[str, Any]] = [{"type": "text", "text": f"turn {t}: what changed?"}]
        for i in range(max(0, t - args.window + 1), t + 1):
            uuid = f"s{sid}-img{i}"
            if mode == "client-strip" and uuid in sent_uuids:
                parts.append({"type": "image_url", "image_url": None, "uuid": uuid})
                continue
            part: dict[str, Any] = {"type": "image_url", "image_url": {"url": images[i]}}
            if mode in ("client-strip", "uuid-resend"):
                part["uuid"] = uuid
                sent_uuids.add(uuid)
            parts.append(part)
        body = json.dumps({"model": MODEL, "stream": True, "max_tokens": 8,
                           "messages": [{"role": "user", "content": parts}]}).encode()
        out["client_bytes"].append(len(body))
        done = await post_streamed(session, url + "/v1/chat/completions", body,
                                   {"Content-Type": "application/json", "x-session-id": f"s{sid}"})
        if done.status != 200:
            out["errors"].append(done.status)
            continue
        out["ttft_ms"].append(1000 * done.ttft_s)
        out["latency_ms"].append(1000 * done.total_s)


async def drive(url: str, mode: str, args: argparse.Namespace) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"client_bytes": [], "ttft_ms": [], "latency_ms": [], "errors": []}
    per_session = [
        ["data:image/jpeg;base64," + base64.b64encode(seeded_jpeg(1000 * s + i, args.image_size, grain=4, quality=90)).decode()
         for i in range(args.turns)]
        for s in range(args.sessions)
    ]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        await asyncio.gather(*(run_session(session, url, s, mode, per_session[s], args, out)
                               for s in range(args.sessions)))
    return out


def run_mode(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    sims, sim_urls = [], []
    gw = None
    try:
        for _ in range(2):
            port = free_port()
            sims.append(start(["sim", "--port", str(port), "--speedup", str(args.sim_speedup)], port))
            sim_urls.append(f"http://127.0.0.1:{port}")
        gw_port = free_port()
        reuse = "auto" if mode == "auto" else "off"
        backend_args = [a for u in sim_urls for a in ("--backend", f"vllm={u}")]
        gw = start(["serve", "--port", str(gw_port), "--reuse", reuse, "--log-level", "warning", *backend_args],
                   gw_port)
        gw_url = f"http://127.0.0.1:{gw_port}"
        t0 = time.perf_counter()
        out = asyncio.run(drive(gw_url, mode, args))
        wall = time.perf_counter() - t0
        sim_metrics = [scrape(u) for u in sim_urls]
        gw_metrics = scrape(gw_url)
    finally:
        if gw is not None:
            stop(gw)
        for p in sims:
            stop(p)
    unique = args.sessions * args.turns
    processed = sum(total(m, "mmgate_sim_images_processed_total") for m in sim_metrics)
    received_images = sum(total(m, "vllm:mm_cache_queries_total") for m in sim_metrics)
    return {
        "mode": mode,
        "requests": len(out["latency_ms"]) + len(out["errors"]),
        "errors": len(out["errors"]),
        "unique_images": unique,
        "logical_images": sum(min(t + 1, args.window) for t in range(args.turns)) * args.sessions,
        "engine_image_queries": received_images,
        "engine_images_processed": processed,
        "engine_decoded_on_hit": sum(total(m, "mmgate_sim_images_decoded_on_hit_total") for m in sim_metrics),
        "engine_image_bytes": sum(total(m, "mmgate_sim_image_bytes_received_total") for m in sim_metrics),
        "gateway_stripped": total(gw_metrics, 'mmgate_images_forwarded_total{mode="stripped"}'),
        "images_sent_with_data": total(gw_metrics, 'mmgate_images_forwarded_total{mode="data"}'),
        "gateway_heals": total(gw_metrics, "mmgate_reuse_heals_total"),
        "client_bytes": sum(out["client_bytes"]),
        "ttft_p50_ms": pct(out["ttft_ms"], 50), "ttft_p99_ms": pct(out["ttft_ms"], 99),
        "latency_p50_ms": pct(out["latency_ms"], 50), "latency_p99_ms": pct(out["latency_ms"], 99),
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--window", type=int, default=4)
    parser.add_argument("--image-size", type=int, default=768)
    parser.add_argument("--sim-speedup", type=float, default=10.0)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--out", default="results/reuse_sliding_window.json")
    args = parse_args(parser, QUICK)
    rows = [run_mode(m, args) for m in args.modes.split(",")]
    unique = rows[0]["unique_images"]
    print(f"{args.sessions} sessions x {args.turns} turns, window {args.window}, {args.image_size}px JPEG; "
          f"unique images {unique}, logical images {rows[0]['logical_images']}")
    print_table([
        Column("mode", 13, lambda r: r["mode"], left=True),
        Column("errors", 7, lambda r: str(r["errors"])),
        Column("img sent", 9, lambda r: str(int(r["images_sent_with_data"]))),
        Column("processed", 10, lambda r: str(int(r["engine_images_processed"]))),
        Column("dec on hit", 11, lambda r: str(int(r["engine_decoded_on_hit"]))),
        Column("MB to eng", 10, lambda r: f"{r['engine_image_bytes'] / 1e6:.1f}"),
        Column("vs limit", 9, lambda r: f"{r['engine_images_processed'] / unique:.2f}x"),
        Column("heals", 6, lambda r: str(int(r["gateway_heals"]))),
        Column("TTFT p50", 10, lambda r: f"{r['ttft_p50_ms']:.1f}ms"),
        Column("TTFT p99", 10, lambda r: f"{r['ttft_p99_ms']:.1f}ms"),
    ], rows)
    write_results(args.out, {"args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
