"""The sim beside real vLLM: the same contract corpus and the same timing workloads against one
real vLLM replica (CPU build, tiny Qwen2-VL, dummy weights) and ``mmgate sim``, side by side.

    .venv/bin/python benchmarks/regression/sim_fidelity.py --out results/sim_fidelity.json
    .venv/bin/python benchmarks/regression/sim_fidelity.py --sim-args "--profile default"   # the uncalibrated sim

Contract: every case of ``tests/support/fidelity.py`` (status, error body, cache counters, usage,
``n``). Timing (one request at a time, medians of ``--repeats``; every prompt starts with a fresh
number so vLLM's prefix cache never skips the prefill): time to first token of text-only prompts
of several lengths (prefill per token), the time per generated token (decode), and an image at
three sizes as a miss, as a hit that carries its bytes (vLLM decodes them before the lookup) and
as a cache-only hit. ``--fit`` prints the sim settings fitted from the real figures
(what the ``tiny-qwen2vl-cpu`` profile holds). Needs the vLLM venv (``make vllm``).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp
from tests.support.fidelity import jpeg_url, run_corpus
from tests.support.vllm import SimProcess, VllmSetup, start_replicas

from benchmarks._procs import ROOT
from benchmarks._run import parse_args, write_results

# Needs real vLLM even so (one replica, 60-90 s to start): the contract corpus and one timing request.
QUICK = {"repeats": 1}

TEXT_LENGTHS = (64, 1024, 2048, 3072)  # prompt tokens of filler text (byte-level: 1 char = 1 token)
IMAGE_SIDES = (224, 512, 768)
WINDOW = 4  # the sliding-window benchmark's requests: 4 cached 768px images by reference
DECODE_TOKENS = 32
PROMPT_TEXT_TOKENS = 73  # "NNNNNN Describe." through the chat template (byte-level tokens)
_TIMEOUT = aiohttp.ClientTimeout(total=120)


_nonces = itertools.count(100_000)


def _body(model: str, parts: list[dict[str, Any]], *, text: str = "Describe.", max_tokens: int = 1,
          stream: bool = True) -> dict[str, Any]:
    """A request whose text starts with a fresh number: vLLM's prefix cache cannot skip its
    prefill (the sim has no prefix cache), so each figure is the work itself."""
    text = f"{next(_nonces)} {text}"
    return {"model": model, "max_tokens": max_tokens, "ignore_eos": True, "stream": stream,
            "messages": [{"role": "user", "content": [{"type": "text", "text": text}, *parts]}]}


async def _ttft(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> float:
    """Seconds to the first SSE event (vLLM sends its first chunk with the first token)."""
    start = time.perf_counter()
    async with http.post(url + "/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {(await resp.read())[:300]!r}")
        async for line in resp.content:
            if line.startswith(b"data: "):
                first = time.perf_counter() - start
                break
        await resp.read()
    return first


async def _latency(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> float:
    start = time.perf_counter()
    async with http.post(url + "/v1/chat/completions", json=body) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}")
    return time.perf_counter() - start


async def measure(url: str, model: str, repeats: int, seed0: int) -> dict[str, list[float]]:
    """Milliseconds of every request of each timing workload against one engine."""
    out: dict[str, list[float]] = {}
    seed = seed0
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as http:
        for _ in range(3):  # warm-up (first shapes, first image)
            await _ttft(http, url, _body(model, [{"type": "image_url", "image_url": {"url": jpeg_url(224, seed0)}}]))
        for n in TEXT_LENGTHS:
            times = [await _ttft(http, url, _body(model, [], text="x" * n)) for _ in range(repeats)]
            out[f"ttft text {n} tok"] = [1e3 * t for t in times]
        for _ in range(repeats):
            one = await _latency(http, url, _body(model, [], stream=False))
            many = await _latency(http, url, _body(model, [], max_tokens=DECODE_TOKENS, stream=False))
            out.setdefault("decode per token", []).append(1e3 * (many - one) / (DECODE_TOKENS - 1))
        for side in IMAGE_SIDES:
            for _ in range(repeats):
                seed += 1
                img, uuid = jpeg_url(side, seed), f"timing-{seed0}-{seed}"
                sent = [{"type": "image_url", "image_url": {"url": img}, "uuid": uuid}]
                ref = [{"type": "image_url", "image_url": None, "uuid": uuid}]
                out.setdefault(f"ttft {side}px miss", []).append(1e3 * await _ttft(http, url, _body(model, sent)))
                out.setdefault(f"ttft {side}px hit with bytes", []).append(
                    1e3 * await _ttft(http, url, _body(model, sent)))
                out.setdefault(f"ttft {side}px hit (reference)", []).append(
                    1e3 * await _ttft(http, url, _body(model, ref)))
        window = []
        for i in range(WINDOW):
            uuid = f"window-{seed0}-{i}"
            await _ttft(http, url, _body(model, [{"type": "image_url", "image_url": {"url": jpeg_url(768, seed0 + 50 + i)},
                                                  "uuid": uuid}]))
            window.append({"type": "image_url", "image_url": None, "uuid": uuid})
        resent = [{"type": "image_url", "image_url": {"url": jpeg_url(768, seed0 + 60 + i)}} for i in range(WINDOW)]
        await _ttft(http, url, _body(model, resent))  # cached by their content: no uuid, as a resending client
        for _ in range(repeats):
            out.setdefault(f"ttft {WINDOW}x768px hit (reference)", []).append(
                1e3 * await _ttft(http, url, _body(model, window)))
            out.setdefault(f"ttft {WINDOW}x768px hit, resent (no uuid)", []).append(
                1e3 * await _ttft(http, url, _body(model, resent)))
    return out


def image_tokens(side: int) -> int:
    grid = round(side / 28)
    return grid * grid


def fit(samples: dict[str, list[float]]) -> dict[str, float]:
    """Sim settings from real figures. From each workload's fastest request (the machine is shared,
    and its noise only ever adds: the fastest is the least disturbed): least squares of TTFT over
    text tokens, and the per-image-token cost from the sliding window's shape (4 cached 768px
    images: the language model's prefill of ~2,900 image tokens costs more per token than one
    image's). From pairs: the miss extra per image token (three sizes) and what resending the
    window with its bytes costs over referencing it. Costs below zero are noise: 0."""
    real = {k: min(v) for k, v in samples.items()}
    xs = list(TEXT_LENGTHS)
    ys = [real[f"ttft text {n} tok"] for n in xs]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    base = max(0.0, my - slope * mx)
    window_tokens = WINDOW * (image_tokens(768) + 2)
    per_image_token = (real[f"ttft {WINDOW}x768px hit (reference)"] - base - slope * PROMPT_TEXT_TOKENS) / window_tokens
    # The extras are small differences between two noisy TTFTs: each is the median of the
    # differences of pairs measured back to back (the miss, then the hit; the window by reference,
    # then resent), so that the machine's drifts cancel.
    def paired(a: str, b: str) -> float:
        return statistics.median(x - y for x, y in zip(samples[a], samples[b], strict=True))

    miss_extra = statistics.fmean(
        paired(f"ttft {s}px miss", f"ttft {s}px hit with bytes") / image_tokens(s) for s in IMAGE_SIDES)
    # What resending costs: the window's cached images with their bytes and no uuid (vLLM parses the
    # larger body, decodes each image and hashes its pixels) against the same by reference.
    sent_extra = paired(f"ttft {WINDOW}x768px hit, resent (no uuid)",
                        f"ttft {WINDOW}x768px hit (reference)") / (WINDOW * image_tokens(768))
    return {
        "request_overhead_ms": round(base, 2),
        "prefill_us_per_text_token": round(1e3 * max(0.0, slope), 2),
        "prefill_us_per_image_token": round(1e3 * max(0.0, per_image_token), 2),
        "miss_us_per_image_token": round(1e3 * max(0.0, miss_extra), 2),
        "sent_us_per_image_token": round(1e3 * max(0.0, sent_extra), 2),
        "decode_ms_per_token": round(real["decode per token"], 3),
    }


def print_contract(real: list[Any], sim: list[Any]) -> int:
    print(f"{'case':<48} {'vLLM':>5} {'sim':>5}  same")
    differ = 0
    for r, s in zip(real, sim, strict=True):
        a, b = r.comparable(), s.comparable()
        same = a == b
        differ += not same
        print(f"{r.case:<48} {r.status:>5} {s.status:>5}  {'yes' if same else 'NO'}")
        if not same:
            for key in a:
                if a[key] != b[key]:
                    print(f"    {key}: vLLM {a[key]!r}\n    {' ' * len(key)}  sim  {b[key]!r}")
    return differ


async def main_async(args: argparse.Namespace) -> int:
    setup = VllmSetup.locate()
    sim = SimProcess(args.log_dir / "sim.log")
    sim.start(args.sim_args.split())
    replicas = []
    try:
        replicas = await asyncio.to_thread(
            functools.partial(start_replicas, setup, 1, args.log_dir, extra_args=args.vllm_args.split()))
        real = replicas[0]
        contract_real = await run_corpus(real)
        contract_sim = await run_corpus(sim)
        print("== contract: the same corpus against real vLLM and the sim ==")
        differ = print_contract(contract_real, contract_sim)
        print(f"{differ} of {len(contract_real)} cases differ\n")
        timing: dict[str, dict[str, list[float]]] = {}
        if args.repeats:
            timing["vllm"] = await measure(real.url, real.model, args.repeats, 1)
            timing["sim"] = await measure(sim.url, sim.model, args.repeats, 2)
            print(f"== timing ({args.repeats} requests each, ms: median and fastest) ==")
            print(f"{'workload':<32} {'vLLM p50':>9} {'sim p50':>9} {'vLLM min':>9} {'sim min':>9} {'sim/vLLM':>9}")
            for key, values in timing["vllm"].items():
                mine, theirs = statistics.median(timing["sim"][key]), statistics.median(values)
                print(f"{key:<32} {theirs:>9.1f} {mine:>9.1f} {min(values):>9.1f} {min(timing['sim'][key]):>9.1f}"
                      f" {mine / theirs if theirs else float('nan'):>9.2f}")
        fitted = fit(timing["vllm"]) if timing else {}
        if args.fit and fitted:
            print("\n== fitted from vLLM ==")
            for key, value in fitted.items():
                print(f"{key} = {value}")
    finally:
        sim.stop()
        for r in replicas:
            r.stop()
    if args.out:
        write_results(args.out, {
            "sim_args": args.sim_args, "repeats": args.repeats,
            "contract": [{"vllm": r.comparable(), "sim": s.comparable()}
                         for r, s in zip(contract_real, contract_sim, strict=True)],
            "timing_ms": timing, "fitted": fitted,
        })
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sim-args", default="--profile tiny-qwen2vl-cpu", help="flags for `mmgate sim`")
    p.add_argument("--vllm-args", default="", help="more flags for the vLLM replica (the last of a flag wins)")
    p.add_argument("--repeats", type=int, default=5, help="requests per timing workload (0: contract only)")
    p.add_argument("--fit", action="store_true", help="print sim settings fitted from vLLM's figures")
    p.add_argument("--out", type=Path, default=None, help="write everything as JSON here")
    p.add_argument("--log-dir", type=Path, default=ROOT / "build" / "sim-fidelity")
    return asyncio.run(main_async(parse_args(p, QUICK)))


if __name__ == "__main__":
    raise SystemExit(main())
