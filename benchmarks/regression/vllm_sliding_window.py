"""The seed's sliding-window benchmark against two real vLLM replicas (CPU build, tiny Qwen2-VL,
dummy weights) on loopback, with and without mmgate in front.

At turn t a session sends its last W images (one new each turn), as agents resending the
conversation do. Five ways to run it, each on fresh images (so no mode profits from another's
caches), the same two replicas for all:

* ``direct-resend``  client → vLLM, every image's bytes every turn, no uuid (what users do today)
* ``direct-strip``   client → vLLM, uuid + bytes once per session, then cache-only references
                     (AIPerf ``--uuid-and-strip``); sessions pinned to a replica by the client
* ``gw-off``         client → ``mmgate serve --reuse off`` → vLLM, the resending client
* ``gw-auto``        client → ``mmgate serve --reuse auto`` → vLLM, the same unmodified client
* ``gw-strip``       client → ``mmgate serve --reuse auto`` → vLLM, the stripping client

Every mode runs ``--rounds`` times, the order of the modes rotated each round, so that the noise
of a shared machine falls on all of them. Reported per mode: TTFT and request latency p50/p90 of
all its rounds' requests, each round's TTFT p50, client bytes, images the client sent with bytes,
vLLM's processor-cache queries and hits (both replicas), the gateway's forwarded images and heals,
errors (counts per round); and the TTFT p50 ratios of the aims, pooled and per round.
``--concurrency`` runs that many sessions at once; ``--models`` picks the tiny model (``tiny``:
hidden 256, 2 layers) and/or one with a smaller language model (``small-lm``: hidden 64, 1 layer).
``--engines sim`` runs the same workload against two ``mmgate sim --profile tiny-qwen2vl-cpu``
processes (the profile fitted to the tiny model here), to set the sim's ratios beside vLLM's.

    .venv/bin/python benchmarks/regression/vllm_sliding_window.py --engines vllm,sim --models tiny \\
        --concurrency 1 --rounds 3 --out results/vllm_sliding_window.json

Needs the vLLM venv (``make vllm``); replicas start once per model (60-90 s).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import re
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
from tests.support.fidelity import jpeg_url
from tests.support.vllm import GatewayProcess, SimProcess, VllmReplica, VllmSetup, start_replicas

from benchmarks._chat import post_streamed
from benchmarks._procs import ROOT
from benchmarks._run import parse_args, write_results

MODES = ("direct-resend", "direct-strip", "gw-off", "gw-auto", "gw-strip")
MODELS = {"tiny": (), "small-lm": ("--hidden-size", "64", "--layers", "1", "--heads", "2", "--kv-heads", "1")}
# The sim leg only (no vLLM), two sessions of two turns, sped up.
QUICK = {"engines": "sim", "models": "tiny", "sessions": 2, "turns": 2, "image_size": 64, "concurrency": "2",
         "rounds": 1, "modes": "direct-strip,gw-auto", "sim_args": "--profile tiny-qwen2vl-cpu --speedup 20"}
_METRIC = re.compile(r"^([a-zA-Z_:]+)(\{[^}]*\})? ([0-9.e+-]+)$", re.M)


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {m.group(1) + (m.group(2) or ""): float(m.group(3)) for m in _METRIC.finditer(text)}


def total(metrics: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in metrics.items() if k.startswith(prefix))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))] if ordered else float("nan")


async def run_session(http: aiohttp.ClientSession, url: str, sid: str, strip: bool, images: list[str],
                      args: argparse.Namespace, out: dict[str, list[float]]) -> None:
    sent: set[str] = set()
    for t in range(args.turns):
        parts: list[dict[str, Any]] = [{"type": "text", "text": f"turn {t} of {sid}: what changed?"}]
        for i in range(max(0, t - args.window + 1), t + 1):
            uuid = f"{sid}-img{i}"
            if strip and uuid in sent:
                parts.append({"type": "image_url", "image_url": None, "uuid": uuid})
                continue
            part: dict[str, Any] = {"type": "image_url", "image_url": {"url": images[i]}}
            if strip:
                part["uuid"] = uuid
                sent.add(uuid)
            out["client_images"].append(1)
            parts.append(part)
        body = json.dumps({"model": "tiny-qwen2vl", "stream": True, "max_tokens": args.max_tokens,
                           "ignore_eos": True, "messages": [{"role": "user", "content": parts}]}).encode()
        out["client_bytes"].append(len(body))
        done = await post_streamed(http, url + "/v1/chat/completions", body,
                                   {"Content-Type": "application/json", "x-session-id": sid}, marker=b"")
        if done.status != 200:
            out["errors"].append(done.status)
            print(f"  {sid} turn {t}: HTTP {done.status} {done.error_body[:200]!r}", file=sys.stderr)
            continue
        out["ttft_ms"].append(1000 * done.ttft_s)
        out["latency_ms"].append(1000 * done.total_s)


async def drive(urls: list[str], mode: str, args: argparse.Namespace, concurrency: int, run: int
                ) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"client_bytes": [], "client_images": [], "ttft_ms": [], "latency_ms": [],
                                   "errors": []}
    strip = mode.endswith("strip")
    limit = asyncio.Semaphore(concurrency)

    async def one(s: int) -> None:
        images = [jpeg_url(args.image_size, 1_000_000 * run + 1000 * s + i) for i in range(args.turns)]
        async with limit:
            await run_session(http, urls[s % len(urls)], f"r{run}-s{s}", strip, images, args, out)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        await asyncio.gather(*(one(s) for s in range(args.sessions)))
    return out


def run_mode(mode: str, replicas: list[VllmReplica] | list[SimProcess], args: argparse.Namespace, concurrency: int, run: int,
             log_dir: Path) -> dict[str, Any]:
    gateway = None
    before = [scrape(r.url) for r in replicas]
    try:
        if mode.startswith("gw-"):
            gateway = GatewayProcess(log_dir / f"gw-{run}.log")
            flags = [f for r in replicas for f in ("--backend", f"vllm={r.url}")]
            gateway.start([*flags, "--reuse", "off" if mode == "gw-off" else "auto", "--log-level", "warning"])
            urls = [gateway.url]
        else:
            urls = [r.url for r in replicas]
        t0 = time.perf_counter()
        out = asyncio.run(drive(urls, mode, args, concurrency, run))
        wall = time.perf_counter() - t0
        gw = scrape(gateway.url) if gateway is not None else {}
    finally:
        if gateway is not None:
            gateway.stop()
    after = [scrape(r.url) for r in replicas]

    def moved(name: str) -> float:
        return sum(total(a, name) - total(b, name) for a, b in zip(after, before, strict=True))

    return {
        "mode": mode, "concurrency": concurrency, "requests": len(out["latency_ms"]) + len(out["errors"]),
        "errors": len(out["errors"]),
        "ttft_p50_ms": pct(out["ttft_ms"], 50), "ttft_p90_ms": pct(out["ttft_ms"], 90),
        "latency_p50_ms": pct(out["latency_ms"], 50), "latency_p90_ms": pct(out["latency_ms"], 90),
        "client_bytes": sum(out["client_bytes"]), "client_images_with_data": len(out["client_images"]),
        "vllm_cache_queries": moved("vllm:mm_cache_queries_total"),
        "vllm_cache_hits": moved("vllm:mm_cache_hits_total"),
        "vllm_prompt_tokens": moved("vllm:prompt_tokens_total"),
        "gw_images_data": total(gw, 'mmgate_images_forwarded_total{mode="data"}'),
        "gw_images_reference": total(gw, 'mmgate_images_forwarded_total{mode="reference"}')
        + total(gw, 'mmgate_images_forwarded_total{mode="stripped"}'),
        "gw_heals": total(gw, "mmgate_reuse_heals_total"),
        "wall_s": wall, "ttft_ms": out["ttft_ms"], "latency_ms": out["latency_ms"],
    }


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (mode, concurrency) over all rounds: TTFT and latency percentiles of the pooled
    requests, the median of the rounds' TTFT p50, and the per-round counts (every round sends the
    same workload on fresh images, so its counts are the same in each)."""
    out = []
    for key in dict.fromkeys((r["mode"], r["concurrency"]) for r in rows):
        group = [r for r in rows if (r["mode"], r["concurrency"]) == key]
        ttft = [t for r in group for t in r["ttft_ms"]]
        latency = [t for r in group for t in r["latency_ms"]]
        n = len(group)
        out.append({
            "mode": key[0], "concurrency": key[1], "rounds": n,
            "requests": sum(r["requests"] for r in group), "errors": sum(r["errors"] for r in group),
            "ttft_p50_ms": pct(ttft, 50), "ttft_p90_ms": pct(ttft, 90),
            "ttft_p50_of_rounds_ms": [r["ttft_p50_ms"] for r in group],
            "latency_p50_ms": pct(latency, 50), "latency_p90_ms": pct(latency, 90),
            **{k: sum(r[k] for r in group) / n for k in (
                "client_bytes", "client_images_with_data", "vllm_cache_queries", "vllm_cache_hits",
                "vllm_prompt_tokens", "gw_images_data", "gw_images_reference", "gw_heals")},
        })
    return out


def ratios(summary: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """TTFT p50 ratios per concurrency: of the pooled requests, and the range over rounds."""
    by = {(r["mode"], r["concurrency"]): r for r in summary}
    out: dict[int, dict[str, Any]] = {}
    for c in sorted({r["concurrency"] for r in summary}):
        entry: dict[str, Any] = {}
        for name, (a, b) in {"auto/strip": ("gw-auto", "direct-strip"), "auto/resend": ("gw-auto", "direct-resend"),
                             "auto/off": ("gw-auto", "gw-off")}.items():
            if (a, c) in by and (b, c) in by:
                per_round = [x / y for x, y in zip(by[(a, c)]["ttft_p50_of_rounds_ms"],
                                                   by[(b, c)]["ttft_p50_of_rounds_ms"], strict=True)]
                entry[name] = {"pooled": by[(a, c)]["ttft_p50_ms"] / by[(b, c)]["ttft_p50_ms"],
                               "rounds": per_round}
        out[c] = entry
    return out


def print_rows(label: str, summary: list[dict[str, Any]]) -> None:
    print(f"\n== {label} ==")
    print(f"{'mode':<14}{'c':>2}{'n':>4}{'err':>4}{'TTFT p50':>10}{'p90':>9}{'lat p50':>9}{'client MB':>10}"
          f"{'img sent':>9}{'cache q/hit':>12}{'gw data/ref/heal':>17}  TTFT p50 of rounds")
    for r in summary:
        gw = f"{r['gw_images_data']:.0f}/{r['gw_images_reference']:.0f}/{r['gw_heals']:.0f}" \
            if r["mode"].startswith("gw-") else "-"
        rounds = ", ".join(f"{v:.0f}" for v in r["ttft_p50_of_rounds_ms"])
        print(f"{r['mode']:<14}{r['concurrency']:>2}{r['requests']:>4}{r['errors']:>4}{r['ttft_p50_ms']:>8.0f}ms"
              f"{r['ttft_p90_ms']:>7.0f}ms{r['latency_p50_ms']:>7.0f}ms{r['client_bytes'] / 1e6:>10.2f}"
              f"{r['client_images_with_data']:>9.0f}{r['vllm_cache_queries']:>6.0f}/{r['vllm_cache_hits']:<5.0f}"
              f"{gw:>17}  {rounds}")
    for c, entry in ratios(summary).items():
        text = "; ".join(f"{name} {v['pooled']:.2f} (rounds {', '.join(f'{x:.2f}' for x in v['rounds'])})"
                         for name, v in entry.items())
        print(f"c={c}: TTFT p50 {text}")


def start_backends(engine: str, model: str, args: argparse.Namespace, base: VllmSetup | None
                   ) -> list[VllmReplica] | list[SimProcess]:
    if engine == "sim":
        sims = [SimProcess(args.log_dir / "sim" / f"sim-{i}.log") for i in range(2)]
        try:
            for sim in sims:
                sim.start(args.sim_args.split())
        except BaseException:
            for sim in sims:
                sim.stop()
            raise
        return sims
    assert base is not None
    setup = dataclasses.replace(base, model_dir=base.model_dir.parent / f"sw-{model}")
    setup.ensure_model(*MODELS[model])
    return start_replicas(setup, 2, args.log_dir / model, extra_args=args.vllm_args.split())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=4)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--window", type=int, default=4)
    p.add_argument("--image-size", type=int, default=768)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--concurrency", default="1,4", help="comma-separated session concurrencies")
    p.add_argument("--rounds", type=int, default=3,
                   help="run every mode this many times, the order rotated each round (noise falls on all)")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--models", default="tiny,small-lm", help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--engines", default="vllm,sim",
                   help="comma-separated: 'vllm' (real replicas) and/or 'sim' (two `mmgate sim` "
                        "processes with --sim-args; the tiny model only: that is what its profile is fitted to)")
    p.add_argument("--sim-args", default="--profile tiny-qwen2vl-cpu", help="flags for `mmgate sim`")
    p.add_argument("--vllm-args", default="", help="more flags for the vLLM replicas (the last of a flag wins), "
                   "e.g. '--dtype float32'")
    p.add_argument("--merge", type=Path, action="append", default=[],
                   help="add the runs of an earlier --out file (repeatable), to compare with them")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "vllm_sliding_window.json")
    p.add_argument("--log-dir", type=Path, default=ROOT / "build" / "vllm-sliding-window")
    args = parse_args(p, QUICK)
    base = VllmSetup.locate() if "vllm" in args.engines.split(",") else None
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "runs": {}}
    modes = args.modes.split(",")
    run = 0
    for engine in args.engines.split(","):
        for model in args.models.split(","):
            if engine == "sim" and model != "tiny":
                continue
            label = f"{engine} {model}"
            backends = start_backends(engine, model, args, base)
            rows = []
            try:
                for c in (int(x) for x in args.concurrency.split(",")):
                    for rnd in range(args.rounds):
                        for mode in modes[rnd % len(modes):] + modes[:rnd % len(modes)]:
                            run += 1
                            rows.append(run_mode(mode, backends, args, c, run, args.log_dir / model))
                            print(f"  {label} c={c} round {rnd} {mode}: TTFT p50 {rows[-1]['ttft_p50_ms']:.0f} ms",
                                  file=sys.stderr)
            finally:
                for b in backends:
                    b.stop()
            summary = summarise(rows)
            results["runs"][label] = {"summary": summary, "ratios": ratios(summary), "rounds": rows}
            print_rows(label, summary)
    for path in args.merge:  # runs of another invocation (e.g. the sim leg run apart from vLLM's)
        for label, entry in json.loads(path.read_text())["runs"].items():
            results["runs"].setdefault(label, entry)
    real, sim = results["runs"].get("vllm tiny"), results["runs"].get("sim tiny")
    if real and sim:
        print("\n== sim against real vLLM (tiny): TTFT p50 gw-auto / gw-off ==")
        for c in real["ratios"]:
            a, b = real["ratios"][c].get("auto/off"), {str(k): v for k, v in sim["ratios"].items()}.get(str(c), {}).get("auto/off")
            if a and b:
                print(f"c={c}: vLLM {a['pooled']:.2f}, sim {b['pooled']:.2f}, sim/vLLM {b['pooled'] / a['pooled']:.2f}")
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
