"""Image-affinity routing on a shared-pool workload: how often the engines process each image.

Many sessions; each turn shows ``--pool-per-turn`` images drawn (Zipf, exponent ``--zipf``) from a
pool of ``--pool`` popular images, plus one image of its own (new each turn; ``--no-own``: none),
optionally a hot image in every request (``--hot``); ``--sessionless`` sends no session header
(a catalogue: every request stands alone). Turns of a session run in order; ``--concurrency`` sessions
at once; turn t of session s goes to gateway (s + t) mod G, so one session's turns cross gateways.
Every run starts fresh processes: B sim engines (vLLM stand-ins, their own processes) behind G
gateway processes (``mmgate serve --routing MODE``), all on loopback.

Reported per (backends, gateways, mode): images the engines processed (decoded + resized +
normalised: their processor-cache misses, ``mmgate_sim_images_processed_total``) / unique images
of the workload (the physical limit: 1.00), image bytes the engines received, TTFT p50/p90, and
load imbalance: every 50 ms the gateways' in-flight counts per backend are summed over the
gateways; imbalance = sum over samples of the max / sum of the mean (time-weighted max/mean, so
the ramp-up and the tail, with a handful in flight, weigh what they last), over samples with at
least B requests in flight.

``--variant LABEL=MODE FLAGS`` adds a mode of its own label (``ia-lf2=image-affinity
--routing-load-factor 2``; a ``NAME=value`` among the flags goes to the gateways' environment;
``{redis}`` in a flag is the URL of a redis-server the row starts for itself:
``ia-sync=image-affinity --routing-sync-url {redis}``; a row with the sync gets a
``--routing-sync-secret-file`` of its own); ``--repeats N`` runs every row N times,
the modes interleaved round by round, and prints the medians (JSON keeps every run), and each
mode's TTFT p50 over ``--baseline``'s (lru-history) round by round: the median ratio, and in how
many rounds it was at or below.

    .venv/bin/python benchmarks/regression/image_affinity.py --backends 2,4 --gateways 1,3
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import re
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import zlib
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks._chat import post_streamed
from benchmarks._images import seeded_jpeg
from benchmarks._procs import MMGATE, free_port, stop
from benchmarks._run import parse_args, write_results
from benchmarks._table import Column, pct, print_table

MODEL = "mmgate-sim-vl"
MODES = ("round-robin", "session", "lru-history", "image-affinity")  # profiles --routing names
QUICK = {"backends": "2", "gateways": "1", "sessions": 2, "turns": 2, "concurrency": 2, "pool": 4,
         "image_size": 64, "modes": "lru-history,image-affinity"}
_SAMPLE = re.compile(r'^mmgate_backend_outstanding\{backend="([^"]+)"\} ([0-9.e+-]+)$', re.M)


def make_image(seed: int, side: int) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(seeded_jpeg(seed, side, grain=8, quality=85)).decode()


def workload(args: argparse.Namespace) -> list[list[list[str]]]:
    """sessions -> turns -> image names (``pool-i``, ``own-s-t``, ``hot``)."""
    rng = random.Random(args.seed)
    weights = [1 / (i + 1) ** args.zipf for i in range(args.pool)]
    sessions = []
    for s in range(args.sessions):
        turns = []
        for t in range(args.turns):
            drawn = list(dict.fromkeys(rng.choices(range(args.pool), weights=weights, k=args.pool_per_turn)))
            names = (["hot"] if args.hot else []) + [f"pool-{i}" for i in drawn]
            names += [f"own-{s}-{t}"] if args.own else []
            turns.append(names)
        sessions.append(turns)
    return sessions


def scrape(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        return str(r.read().decode())


def cache_misses(text: str) -> float:
    """A vLLM engine's processor-cache misses so far (queries - hits): the images it processed."""
    return total(text, "vllm:mm_cache_queries_total") - total(text, "vllm:mm_cache_hits_total")


def total(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", text, re.M))


def start_all(commands: list[tuple[list[str], int]], timeout_s: float = 90.0,
              env: dict[str, str] | None = None) -> list[subprocess.Popen[bytes]]:
    """Start every ``mmgate`` process at once, then wait until each one's /health answers."""
    full_env = {**os.environ, **env} if env else None
    procs = [subprocess.Popen([*MMGATE, *a], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=full_env)
             for a, _ in commands]
    deadline = time.monotonic() + timeout_s
    try:
        for proc, (cmd, port) in zip(procs, commands, strict=True):
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"mmgate {' '.join(cmd)} exited: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"mmgate {' '.join(cmd)} did not come up")
                time.sleep(0.1)
    except BaseException:
        for p in procs:
            stop(p)
        raise
    return procs


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process so far (/proc/PID/stat; Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sync_secret_file() -> str:
    """A file holding a routing-sync secret for the gateways of a run (the sync requires one)."""
    path = Path(tempfile.gettempdir()) / f"mmgate-bench-sync-secret-{os.getpid()}"
    if not path.exists():
        path.write_text(secrets.token_hex(32))
    return str(path)


def start_redis(port: int, timeout_s: float = 10.0) -> subprocess.Popen[bytes]:
    """A throwaway redis-server on 127.0.0.1:``port`` (no persistence), once it accepts connections."""
    proc = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop(proc)
                raise RuntimeError(f"redis-server on port {port} did not come up") from None
            time.sleep(0.05)


async def sample_loads(session: aiohttp.ClientSession, gateways: list[str], backends: int,
                       out: list[float], done: asyncio.Event, totals: list[float] | None = None) -> None:
    while not done.is_set():
        loads: dict[str, float] = {}
        for gw in gateways:
            try:
                async with session.get(gw + "/metrics") as r:
                    text = await r.text()
            except aiohttp.ClientError:
                continue
            for name, value in _SAMPLE.findall(text):
                loads[name] = loads.get(name, 0.0) + float(value)
        in_flight = sum(loads.values())
        if totals is not None and len(loads) == backends:
            totals.append(in_flight)
        if len(loads) == backends and in_flight >= backends:
            out.append(max(loads.values()))
            out.append(in_flight / backends)
        try:
            await asyncio.wait_for(done.wait(), 0.05)
        except TimeoutError:
            pass


async def run_session(client: aiohttp.ClientSession, gateways: list[str], sid: int, turns: list[list[str]],
                      urls: dict[str, str], out: dict[str, list[float]], max_tokens: int, sessionless: bool,
                      model: str) -> None:
    for t, names in enumerate(turns):
        parts: list[dict[str, Any]] = [{"type": "text", "text": f"turn {t}: compare these"}]
        parts += [{"type": "image_url", "image_url": {"url": urls[n]}} for n in names]
        body = json.dumps({"model": model, "stream": True, "max_tokens": max_tokens,
                           "messages": [{"role": "user", "content": parts}]}).encode()
        gw = gateways[(sid + t) % len(gateways)]
        headers = {"Content-Type": "application/json"}
        if not sessionless:
            headers["x-session-id"] = f"session-{sid}"
        done = await post_streamed(client, gw + "/v1/chat/completions", body, headers)
        if done.status != 200:
            out["errors"].append(float(done.status))
            continue
        out["ttft_ms"].append(1000 * done.ttft_s)


async def drive(gateways: list[str], backends: int, sessions: list[list[list[str]]], urls: dict[str, str],
                args: argparse.Namespace) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"ttft_ms": [], "errors": [], "imbalance": [], "in_flight": []}
    queue = list(enumerate(sessions))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as client:
        done = asyncio.Event()
        sampler = asyncio.create_task(sample_loads(client, gateways, backends, out["imbalance"], done, out["in_flight"]))

        async def worker() -> None:
            while queue:
                sid, turns = queue.pop(0)
                await run_session(client, gateways, sid, turns, urls, out, args.max_tokens, args.sessionless,
                                  args.model)

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        done.set()
        await sampler
    return out


def run_one(backends: int, gateways: int, mode: str, sessions: list[list[list[str]]], urls: dict[str, str],
            args: argparse.Namespace, engines: list[str] | None = None) -> dict[str, Any]:
    """One row on fresh gateways: fresh sim engines, or the running ``engines`` (real vLLM), whose
    processing is then the change of their processor-cache misses over the run."""
    sim_ports = [free_port() for _ in range(backends)] if engines is None else []
    gw_ports = [free_port() for _ in range(gateways)]
    sim_cmds = [(["sim", "--port", str(p), "--speedup", str(args.sim_speedup),
                  "--mm-processor-cache-gb", str(args.sim_cache_gb), *args.sim_args.split()], p) for p in sim_ports]
    engine_urls = engines if engines is not None else [f"http://127.0.0.1:{p}" for p in sim_ports]
    backend_args = [a for u in engine_urls for a in ("--backend", f"vllm={u}")]
    routing, *flags = args.variants.get(mode, mode).split()
    env = dict(f.split("=", 1) for f in flags if re.fullmatch(r"[A-Z][A-Z0-9_]*=.*", f))  # VAR=value: environment
    flags = [f for f in flags if not re.fullmatch(r"[A-Z][A-Z0-9_]*=.*", f)]
    extra = args.affinity_args.split() if routing == "image-affinity" else []
    redis_port = free_port() if any("{redis}" in f for f in [*flags, *extra]) else None
    if redis_port is not None:  # --routing-sync-url {redis}: a redis-server of the row's own
        flags, extra = ([f.replace("{redis}", f"redis://127.0.0.1:{redis_port}") for f in fs] for fs in (flags, extra))
    if any(f.startswith("--routing-sync") for f in [*flags, *extra]) and "--routing-sync-secret-file" not in flags:
        flags += ["--routing-sync-secret-file", sync_secret_file()]
    gw_cmds = [(["serve", "--port", str(p), "--routing", routing, "--log-level", "warning", *backend_args, *extra,
                 *flags], p) for p in gw_ports]
    procs: list[subprocess.Popen[bytes]] = []
    before = [cache_misses(scrape(u)) for u in engine_urls] if engines is not None else []
    try:
        if redis_port is not None:
            procs.append(start_redis(redis_port))
        procs += start_all(sim_cmds)
        procs += start_all(gw_cmds, env=env)
        gw_urls = [f"http://127.0.0.1:{p}" for p in gw_ports]
        t0 = time.perf_counter()
        out = asyncio.run(drive(gw_urls, backends, sessions, urls, args))
        wall = time.perf_counter() - t0
        sims = [scrape(u) for u in engine_urls]
        gws = [scrape(u) for u in gw_urls]
        # CPU the gateways (and the sync's redis-server) used over the whole row, start-up included.
        gw_cpu = sum(cpu_seconds(p.pid) for p in procs[len(procs) - len(gw_cmds):])
        redis_cpu = cpu_seconds(procs[0].pid) if redis_port is not None else 0.0
    finally:
        for p in reversed(procs):
            stop(p)
    unique = len({n for turns in sessions for names in turns for n in names})
    if engines is None:
        processed = sum(total(m, "mmgate_sim_images_processed_total") for m in sims)
    else:  # vLLM: processor-cache queries that missed, over this run
        processed = sum(cache_misses(m) for m in sims) - sum(before)
    reasons: dict[str, float] = {}
    for text in gws:
        for reason, value in re.findall(r'^mmgate_routing_decisions_total\{reason="([^"]+)"\} ([0-9.e+-]+)$', text, re.M):
            reasons[reason] = reasons.get(reason, 0.0) + float(value)
    hits = sum(float(v) for t in gws for v in re.findall(r'^mmgate_routing_image_weight_total\{[^}]*outcome="hit"\} (\S+)$', t, re.M))
    misses = sum(float(v) for t in gws for v in re.findall(r'^mmgate_routing_image_weight_total\{[^}]*outcome="miss"\} (\S+)$', t, re.M))
    return {
        "backends": backends, "gateways": gateways, "mode": mode,
        "requests": len(out["ttft_ms"]) + len(out["errors"]), "errors": len(out["errors"]),
        "unique_images": unique,
        "engine_images_processed": processed,
        "processed_per_unique": processed / unique,
        "engine_image_bytes": sum(total(m, "mmgate_sim_image_bytes_received_total") for m in sims)
        if engines is None else float("nan"),  # vLLM does not count the bytes it receives
        "ttft_p50_ms": pct(out["ttft_ms"], 50), "ttft_p90_ms": pct(out["ttft_ms"], 90),
        "imbalance": (sum(out["imbalance"][0::2]) / sum(out["imbalance"][1::2])) if out["imbalance"] else float("nan"),
        "imbalance_samples": len(out["imbalance"]) // 2,
        # requests in flight over all gateways at each sample: {count: samples}
        "in_flight_samples": {int(k): out["in_flight"].count(k) for k in sorted(set(out["in_flight"]))},
        "decisions": reasons,
        "gateway_weight_hit_ratio": hits / (hits + misses) if hits + misses else float("nan"),
        "wall_s": wall,
        "gateway_cpu_s": gw_cpu, "redis_cpu_s": redis_cpu,
        "sync_messages": {f"{d}_{o}": sum(float(v) for t in gws for v in re.findall(
            rf'^mmgate_routing_sync_messages_total{{direction="{d}",outcome="{o}"}} (\S+)$', t, re.M))
            for d in ("sent", "received") for o in ("ok", "error", "invalid")},
    }


def add_workload_args(parser: argparse.ArgumentParser) -> None:
    """The flags ``workload`` reads (also the offline bound's, so both see the same requests)."""
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--pool", type=int, default=24)
    parser.add_argument("--pool-per-turn", type=int, default=2)
    parser.add_argument("--zipf", type=float, default=1.0)
    parser.add_argument("--hot", action="store_true", help="one hot image in every request")
    parser.add_argument("--no-own", dest="own", action="store_false", help="no image of its own per turn")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(parser)
    parser.add_argument("--sessionless", action="store_true", help="send no session header")
    parser.add_argument("--image-size", type=int, default=448)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--sim-speedup", type=float, default=4.0)
    parser.add_argument("--sim-cache-gb", type=float, default=4.0)
    parser.add_argument("--sim-args", default="--enable-server-load-tracking",
                        help="extra mmgate sim flags (default: /load counts requests in flight, as vLLM's "
                        "--enable-server-load-tracking)")
    parser.add_argument("--backends", default="2,4")
    parser.add_argument("--gateways", default="1,3")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--affinity-args", default="", help="extra mmgate serve flags for image-affinity runs")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL=MODE FLAGS",
                        help="a mode named LABEL: --routing MODE plus FLAGS (repeatable)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of every row, interleaved; medians shown")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--engine", choices=("sim", "vllm"), default="sim",
                        help="vllm: real vLLM replicas (MMGATE_VLLM_VENV, tests/support/vllm.py), started once "
                        "with --enable-server-load-tracking; every run gets images of its own, so its processing is "
                        "the change of the replicas' processor-cache misses")
    parser.add_argument("--log-dir", default="build/image-affinity-vllm", help="vLLM replica logs")
    parser.add_argument("--baseline", default="lru-history",
                        help="mode the others' TTFT is compared with, round by round (the ratio's median)")
    parser.add_argument("--out", default="results/image_affinity.json")
    args = parse_args(parser, QUICK)
    sessions = workload(args)
    names = sorted({n for turns in sessions for t in turns for n in t})
    args.variants = dict(v.split("=", 1) for v in args.variant)
    args.model = MODEL
    backend_counts = [int(x) for x in args.backends.split(",")]
    replicas: list[Any] = []
    if args.engine == "vllm":
        from tests.support.vllm import SERVED_MODEL, VllmSetup, start_replicas

        args.model = SERVED_MODEL
        replicas = start_replicas(VllmSetup.locate(), max(backend_counts), Path(args.log_dir),
                                  extra_args=("--enable-server-load-tracking",))
    runs: list[dict[str, Any]] = []
    try:
        for repeat in range(args.repeats):
            for b in backend_counts:
                for g in (int(x) for x in args.gateways.split(",")):
                    for mode in args.modes.split(","):
                        # Against long-lived vLLM replicas every run needs images never sent before.
                        salt = len(runs) * 7919 if replicas else 0
                        urls = {n: make_image(hash_seed(n) + salt, args.image_size) for n in names}
                        engines = [r.url for r in replicas[:b]] if replicas else None
                        row = run_one(b, g, mode, sessions, urls, args, engines)
                        row["repeat"] = repeat
                        runs.append(row)
                        print(f"  done {b} backends, {g} gateways, {mode} (run {repeat + 1}): "
                              f"{row['processed_per_unique']:.2f}x, imbalance {row['imbalance']:.2f}, "
                              f"TTFT p50 {row['ttft_p50_ms']:.0f} ms, {row['wall_s']:.1f}s", file=sys.stderr,
                              flush=True)
    finally:
        for r in replicas:
            r.stop()
    rows = medians(runs)
    add_paired_ratios(rows, runs, args.baseline)
    print(f"{args.sessions} sessions x {args.turns} turns; each turn {args.pool_per_turn} of {args.pool} pool "
          f"images (zipf {args.zipf}){' + 1 own' if args.own else ''}{' + 1 hot' if args.hot else ''}"
          f"{'; no session header' if args.sessionless else ''}; {args.image_size}px JPEG; "
          f"unique images {rows[0]['unique_images']}; concurrency {args.concurrency}"
          f"{f'; medians of {args.repeats} runs' if args.repeats > 1 else ''}")
    print_table(COLUMNS, rows)
    write_results(args.out, {"args": vars(args), "command": " ".join(sys.argv), "rows": rows, "runs": runs})


MEDIAN_KEYS = ("engine_images_processed", "processed_per_unique", "engine_image_bytes", "ttft_p50_ms",
               "ttft_p90_ms", "imbalance", "gateway_weight_hit_ratio", "errors", "wall_s", "gateway_cpu_s",
               "redis_cpu_s")


def medians(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (backends, gateways, mode), first-seen order: the median of each figure."""
    groups: dict[tuple[int, int, str], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["backends"], r["gateways"], r["mode"]), []).append(r)
    rows = []
    for group in groups.values():
        row = {k: v for k, v in group[0].items() if k not in MEDIAN_KEYS and k != "repeat"}
        row.update({k: statistics.median(r[k] for r in group) for k in MEDIAN_KEYS})
        row["runs"] = len(group)
        rows.append(row)
    return rows


def add_paired_ratios(rows: list[dict[str, Any]], runs: list[dict[str, Any]], baseline: str) -> None:
    """Each row's TTFT p50 over the ``baseline`` mode's of the same round (same backends and
    gateways, run next to it): the median ratio and the rounds at or below 1. The machine's load
    moves every mode of a round together, so the paired ratio is steadier than two medians."""
    base = {(r["backends"], r["gateways"], r["repeat"]): r["ttft_p50_ms"] for r in runs if r["mode"] == baseline}
    for row in rows:
        ratios = [r["ttft_p50_ms"] / base[key] for r in runs
                  if (r["backends"], r["gateways"], r["mode"]) == (row["backends"], row["gateways"], row["mode"])
                  and (key := (r["backends"], r["gateways"], r["repeat"])) in base and base[key] > 0]
        row["ttft_p50_vs_baseline"] = statistics.median(ratios) if ratios else float("nan")
        row["ttft_p50_rounds_at_or_below_baseline"] = [sum(x <= 1.0 for x in ratios), len(ratios)]


COLUMNS = [
    Column("B", 2, lambda r: str(r["backends"])),
    Column("G", 3, lambda r: str(r["gateways"])),
    Column(" mode", 16, lambda r: " " + r["mode"], left=True),
    Column("err", 4, lambda r: str(r["errors"])),
    Column("processed", 10, lambda r: str(int(r["engine_images_processed"]))),
    Column("/unique", 8, lambda r: f"{r['processed_per_unique']:.2f}x"),
    Column("MB to eng", 10, lambda r: f"{r['engine_image_bytes'] / 1e6:.1f}"),
    Column("TTFT p50", 10, lambda r: f"{r['ttft_p50_ms']:.1f}ms"),
    Column("TTFT p90", 10, lambda r: f"{r['ttft_p90_ms']:.1f}ms"),
    Column("imbalance", 10, lambda r: f"{r['imbalance']:.2f}"),
    Column("gw hit", 8, lambda r: f"{r['gateway_weight_hit_ratio']:.2f}"),
    Column("gw CPU", 8, lambda r: f"{r['gateway_cpu_s']:.1f}s"),
    Column("p50/base", 15, lambda r: f"{r['ttft_p50_vs_baseline']:.2f} "
           f"({r['ttft_p50_rounds_at_or_below_baseline'][0]}/{r['ttft_p50_rounds_at_or_below_baseline'][1]})"),
]


def hash_seed(name: str) -> int:
    return zlib.crc32(name.encode())


if __name__ == "__main__":
    main()
