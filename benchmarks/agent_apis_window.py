"""The sliding window through the Anthropic Messages and OpenAI Responses APIs on one real vLLM
replica (CPU build, tiny Qwen2-VL, dummy weights), direct and through ``mmgate serve --reuse auto``.

At turn t an unmodified agent sends its whole conversation: its last W screenshots (one new each
turn), as base64 image blocks (Messages) or ``input_image`` data URLs (Responses). Each (API,
route) pair runs on fresh images, streamed, at concurrency 1. Reported: TTFT p50/p90, the images
the engine processed (``vllm:mm_cache_queries_total`` less hits: what it decoded and hashed),
unique images, and their ratio.

    .venv/bin/python benchmarks/agent_apis_window.py --turns 8 --window 4 --sessions 2 --rounds 4 \\
        --out results/agent_apis_window.json

Needs the vLLM venv (``make vllm``); the replica starts in 60-90 s.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.images import data_url, make_image  # noqa: E402
from tests.support.vllm import SERVED_MODEL, VllmReplica, VllmSetup, cache_counters, running_gateway_process  # noqa: E402

_SEEDS = itertools.count(time.time_ns() % 1_000_000_007)


def fresh_jpeg() -> str:
    """A 224x224 JPEG (64 image tokens) no run has sent before: the replica's caches never hold it."""
    return data_url(make_image("JPEG", 224, 224, seed=next(_SEEDS), noise=0.5), "image/jpeg")


def messages_body(shots: list[str]) -> tuple[str, dict[str, Any]]:
    content: list[dict[str, Any]] = [{"type": "text", "text": "What changed on the screen?"}]
    content += [{"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": s.split(",", 1)[1]}}
                for s in shots]
    return "/v1/messages", {"model": SERVED_MODEL, "max_tokens": 4, "temperature": 0, "stream": True,
                            "messages": [{"role": "user", "content": content}]}


def responses_body(shots: list[str]) -> tuple[str, dict[str, Any]]:
    content: list[dict[str, Any]] = [{"type": "input_text", "text": "What changed on the screen?"}]
    content += [{"type": "input_image", "image_url": s} for s in shots]
    return "/v1/responses", {"model": SERVED_MODEL, "max_output_tokens": 4, "temperature": 0, "stream": True,
                             "store": False, "input": [{"role": "user", "content": content}]}


# The first generated text of each API's stream (its earlier events come before the prefill).
FIRST_TEXT = {"messages": b"text_delta", "responses": b"output_text.delta"}


async def session(
    http: aiohttp.ClientSession, url: str, api: str, sid: str, args: argparse.Namespace, reuse: dict[str, int]
) -> list[float]:
    shots: list[str] = []
    ttfts = []
    build = messages_body if api == "messages" else responses_body
    for _ in range(args.turns):
        shots = [*shots, fresh_jpeg()][-args.window:]
        path, body = build(shots)
        started = time.perf_counter()
        async with http.post(url + path, json=body, headers={"x-session-id": sid}) as resp:
            assert resp.status == 200, await resp.text()
            for part in resp.headers.get("x-mmgate-reuse", "").split(";"):
                key, _, value = part.strip().partition("=")
                if key:
                    reuse[key] = reuse.get(key, 0) + int(value)
            first = None
            seen = b""
            async for chunk in resp.content.iter_any():
                if first is None:
                    seen = seen[-64:] + chunk
                    if FIRST_TEXT[api] in seen:
                        first = time.perf_counter() - started
            ttfts.append(first if first is not None else time.perf_counter() - started)
    return ttfts


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(url: str, replica_url: str, api: str, route: str, args: argparse.Namespace) -> dict[str, Any]:
    queries0, hits0 = cache_counters(replica_url)
    reuse: dict[str, int] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
        ttfts = []
        for s in range(args.sessions):
            ttfts += await session(http, url, api, f"{api}-{route}-{s}-{time.time_ns()}", args, reuse)
    queries1, hits1 = cache_counters(replica_url)
    processed = (queries1 - queries0) - (hits1 - hits0)
    unique = args.sessions * args.turns
    return {"api": api, "route": route, "requests": len(ttfts), "ttft_p50_s": pct(ttfts, 0.5),
            "ttft_p90_s": pct(ttfts, 0.9), "images_processed": processed, "unique_images": unique,
            "processed_per_unique": processed / unique, "gateway_sent": reuse.get("sent"),
            "gateway_stripped": reuse.get("stripped")}


def measure(vllm_url: str, gateway_url: str, args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    """Each round runs every (API, route) pair, the routes' order swapped every other round, so
    that a busy machine's noise and a replica's warm-up fall on both."""
    routes = [("direct", vllm_url), ("gateway", gateway_url)]
    for n in range(args.rounds):
        for api in ("messages", "responses"):
            for route, url in routes if n % 2 == 0 else routes[::-1]:
                rows.append({"round": n, **asyncio.run(run(url, vllm_url, api, route, args))})
                r = rows[-1]
                print(f"round {n} {api:10} {route:8} ttft p50 {r['ttft_p50_s'] * 1000:7.1f} ms  p90 "
                      f"{r['ttft_p90_s'] * 1000:7.1f} ms  images processed {r['images_processed']:4.0f} / "
                      f"unique {r['unique_images']} = {r['processed_per_unique']:.2f}  images sent with bytes "
                      f"{r['gateway_sent'] if r['gateway_sent'] is not None else r['requests'] * args.window}",
                      flush=True)
    for api in ("messages", "responses"):
        p50 = {route: pct([r["ttft_p50_s"] for r in rows if r["api"] == api and r["route"] == route], 0.5)
               for route, _ in routes}
        print(f"{api:10} TTFT p50 (median of rounds) gateway / direct = {p50['gateway'] / p50['direct']:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--window", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--vllm-url", help="a running replica to use (with --gateway-url) instead of starting one")
    parser.add_argument("--gateway-url", help="a running mmgate serve --reuse auto in front of --vllm-url")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    if args.vllm_url and args.gateway_url:
        measure(args.vllm_url, args.gateway_url, args, rows)
    else:
        tmp = Path(tempfile.mkdtemp(prefix="agent-apis-"))
        replica = VllmReplica(VllmSetup.locate(), tmp / "vllm.log")
        replica.start()
        try:
            with running_gateway_process([replica.url], tmp / "gw.log", "--reuse", "auto") as gw:
                measure(replica.url, gw.url, args, rows)
        finally:
            replica.stop()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
