"""Agent capacity on one real vLLM replica: what an unmodified agent gets through mmgate, beside a
client that strips its own repeats, and beside sending straight to vLLM.

C agents (``--concurrency``, several values) each run one session of screenshot turns for
``--duration`` seconds per mode: every turn carries the agent's last ``--window`` 1280x800 PNG
screenshots, one new (``_agent_turns``), streamed, ``--max-tokens`` output tokens. Modes:

* ``direct``        client → vLLM, every screenshot's bytes every turn (what agents do)
* ``strip``         client → vLLM, uuid + bytes once, then cache-only references (AIPerf's
                    ``--uuid-and-strip``; chat and Responses: vLLM's Messages takes no uuid)
* ``mmgate``        the unmodified client → ``mmgate serve`` (defaults) → vLLM
* ``mmgate-strip``  the stripping client → ``mmgate serve`` → vLLM
* ``mmgate-base``   with ``--baseline SRC``: the unmodified client → a gateway from another tree
* ``floor``         an ideal stripping gateway (chat and Responses): the stripping client's body
                    padded with spaces to the unmodified client's size (which it builds too) →
                    ``benchmarks/servers/bare_relay.py``, which forwards the stripped bytes only:
                    what the best gateway on aiohttp costs, its relay and nothing of its own work

Per cell (API, C, mode): full-window turns/s (turns before the window fills are not counted),
TTFT p50/p90, errors, CPU seconds per turn of vLLM's API server, its engine (the API server's
child processes) and the gateway (its process tree: front door, decode workers), read from /proc,
and vLLM's processor-cache misses per turn (queries less hits: 1.00 is one new screenshot a turn
processed, the rest found in its cache; a direct client's repeats hit too, but only after vLLM
decoded and hashed their pixels to find them: that work shows in the API server's CPU).
Each round runs every mode on fresh screenshots (made before the timed loop), the order of the
modes reversed every other round, after an uncounted warm-up round of ``--warmup`` seconds a mode;
beside each run: the 1-minute load and the CPU seconds spent by processes other than vLLM, the
gateway and this client (a run beside other work is worthless: repeat it).

The model is the capped micro Qwen2-VL (``make vllm MODEL=micro``): images capped at 100,352
pixels (128 tokens), a one-layer language model, so a turn's cost is the API server's image work,
the regime of a GPU user. vLLM's CPU worker busy-polls a core; nothing is pinned.

    .venv/bin/python benchmarks/regression/agent_capacity.py --apis chat,responses,messages --concurrency 1,4 \\
        --duration 20 --rounds 2 --out results/agent_capacity.json

Needs the vLLM venv (``make vllm MODEL=micro``); the replica starts in 60-90 s.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from tests.support.vllm import SERVED_MODEL, GatewayProcess, VllmReplica, VllmSetup, cache_counters

from benchmarks._agent_turns import FIRST_OUTPUT, PATHS, screenshots, turn_body
from benchmarks._procs import ROOT, cpu_seconds, machine_busy_s
from benchmarks._run import parse_args, write_results
from benchmarks._table import Column, fmt_interval, pct, print_table, ratio_interval
from benchmarks.servers.bare_relay import KEEP_HEADER

MODES = ("direct", "strip", "mmgate", "mmgate-strip")
# One API, one agent, one round of a few seconds a mode: the replica's start is most of the run.
QUICK = {"apis": "chat", "concurrency": "1", "duration": 4.0, "rounds": 1, "warmup": 1.0,
         "expect_turns_per_s": 5.0}
BASELINE_MODE = "mmgate-base"  # the unmodified client through --baseline's gateway
FLOOR_MODE = "floor"  # an ideal stripping gateway: aiohttp's bare relay of a padded stripped body
RELAY = ROOT / "benchmarks" / "servers" / "bare_relay.py"


class FloorRelay(GatewayProcess):
    """``benchmarks/servers/bare_relay.py`` in front of the replica on ``backend_port`` (``floor``)."""

    name = "bare relay"

    def __init__(self, log_path: Path, backend_port: int) -> None:
        super().__init__(log_path)
        self.backend_port = backend_port

    def start(self, args: Sequence[str], timeout_s: float = 30.0) -> None:
        self._spawn([sys.executable, str(RELAY), str(self.port), str(self.backend_port)])
        self.wait_ready(time.monotonic() + timeout_s)


# Screenshot seeds: each run takes a range no other run (nor an earlier invocation) has used.
_SEEDS = itertools.count(time.time_ns() // 1000)


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children, theirs, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def tree_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            total += cpu_seconds(pid)
        except (FileNotFoundError, ProcessLookupError):  # a worker that just ended
            continue
    return total


class Meters:
    """CPU of vLLM's API server, its engine processes, the gateways' process trees and this client."""

    def __init__(self, vllm_pid: int, gateway_pids: list[int], vllm_url: str) -> None:
        self.vllm_pid, self.gateway_pids, self.vllm_url = vllm_pid, gateway_pids, vllm_url

    def read(self) -> dict[str, float]:
        engine = descendants(self.vllm_pid)
        return {"vllm_api": cpu_seconds(self.vllm_pid), "vllm_engine": tree_cpu(engine),
                "gateway": tree_cpu(sorted({p for pid in self.gateway_pids for p in (pid, *descendants(pid))})),
                "client": cpu_seconds(os.getpid()), "machine": machine_busy_s()}


async def agent(http: aiohttp.ClientSession, url: str, api: str, mode: str, shots: list[str], name: str,
                deadline: float, args: argparse.Namespace, out: dict[str, Any]) -> None:
    """One agent's session: a turn per new screenshot until the deadline or its screenshots run out."""
    sent: set[str] | None = set() if mode.endswith("strip") or mode == FLOOR_MODE else None
    marker = FIRST_OUTPUT[api]
    for t in range(len(shots)):
        if time.monotonic() >= deadline:
            return
        first = max(0, t - args.window + 1)
        window = [(f"{name}-{i}", shots[i]) for i in range(first, t + 1)]
        turn = {**turn_body(api, SERVED_MODEL, window, sent, args.max_tokens), **args.extra_body}
        if args.inline_system and api == "messages":  # a per-turn reminder, as Claude Code sends
            turn["messages"] = [{"role": "system", "content": f"Reminder: this is turn {t}."}, *turn["messages"]]
        body = orjson.dumps(turn)
        headers = {"Content-Type": "application/json", "x-session-id": name}
        if mode == FLOOR_MODE:  # the unmodified client's body, built and sent: its size, stripped bytes first
            full = orjson.dumps({**turn_body(api, SERVED_MODEL, window, None, args.max_tokens), **args.extra_body})
            headers[KEEP_HEADER] = str(len(body))
            body += b" " * (len(full) - len(body))
        started = time.perf_counter()
        ttft = None
        async with http.post(url + PATHS[api], data=body, headers=headers) as resp:
            head = time.perf_counter()
            if resp.status != 200:
                out["errors"].append(resp.status)
                print(f"  {name} turn {t}: HTTP {resp.status} {(await resp.read())[:300]!r}", file=sys.stderr)
                continue
            seen = b""
            async for chunk in resp.content.iter_any():
                if ttft is None:
                    seen = seen[-64:] + chunk
                    if marker in seen:
                        ttft = time.perf_counter() - started
        done = time.perf_counter()
        out["all_turns"] += 1
        if t >= args.window - 1:  # a full window: the turns that are counted
            out["ttft_ms"].append(1000 * (ttft if ttft is not None else done - started))
            out["head_ms"].append(1000 * (head - started))
            out["turn_ms"].append(1000 * (done - started))
            out["turn_ends"].append(time.monotonic())


async def drive(url: str, api: str, mode: str, concurrency: int, shots: list[list[str]], run_id: str,
                args: argparse.Namespace, meters: Meters, duration: float) -> dict[str, Any]:
    out: dict[str, Any] = {"ttft_ms": [], "head_ms": [], "turn_ms": [], "turn_ends": [], "errors": [],
                           "all_turns": 0}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as http:
        queries0, hits0 = cache_counters(meters.vllm_url)
        before = meters.read()
        load = os.getloadavg()[0]
        started = time.monotonic()
        deadline = started + duration
        await asyncio.gather(*(agent(http, url, api, mode, shots[a], f"{run_id}-a{a}", deadline, args, out)
                               for a in range(concurrency)))
        elapsed = time.monotonic() - started
        after = meters.read()
        queries1, hits1 = cache_counters(meters.vllm_url)
    cpu = {k: after[k] - before[k] for k in before}
    others = cpu["machine"] - cpu["vllm_api"] - cpu["vllm_engine"] - cpu["gateway"] - cpu["client"]
    turns = len(out["turn_ends"])
    return {"api": api, "mode": mode, "concurrency": concurrency, "turns": turns, "elapsed_s": elapsed,
            "turns_per_s": turns / elapsed, "ttft_ms": out["ttft_ms"], "head_ms": out["head_ms"],
            "turn_ms": out["turn_ms"], "errors": len(out["errors"]),
            "cpu_per_turn_ms": {k: 1000 * v / max(turns, 1) for k, v in cpu.items() if k != "machine"},
            # vLLM's processor-cache misses (queries less hits) per turn of any kind: one new
            # screenshot a turn is the floor.
            "images_processed_per_turn": ((queries1 - queries0) - (hits1 - hits0)) / max(out["all_turns"], 1),
            "load_1m": load, "others_cpu_s": others}


def modes_for(api: str, wanted: list[str]) -> list[str]:
    return [m for m in wanted if api != "messages" or not (m.endswith("strip") or m == FLOOR_MODE)]


def measure(vllm: VllmReplica, gateways: dict[str, GatewayProcess], args: argparse.Namespace
            ) -> list[dict[str, Any]]:
    """Every round: each API's modes at each C (module docstring). ``gateways``: mode → gateway
    (the idle one's CPU is counted too: it is the same few µs in every run)."""
    assert vllm.proc is not None
    pids = {g.proc.pid for g in gateways.values() if g.proc is not None}  # one gateway serves two modes
    meters = Meters(vllm.proc.pid, sorted(pids), vllm.url)
    runs: list[dict[str, Any]] = []
    expected: dict[tuple[str, int, str], float] = {}
    # Round -1, not counted: each mode's first turns (the gateway's first requests, vLLM's first of
    # each API) read up to 40% slow.
    for n in range(-1 if args.warmup > 0 else 0, args.rounds):
        duration = args.warmup if n < 0 else args.duration
        for concurrency in args.concurrency:
            for api in args.apis:
                modes = modes_for(api, args.modes)
                for mode in modes if n % 2 == 0 else modes[::-1]:
                    rate = expected.get((api, concurrency, mode), args.expect_turns_per_s)
                    per_agent = int(rate * duration * 1.5 / concurrency) + args.window + 2
                    seeds = [next(_SEEDS) for _ in range(per_agent * concurrency)]
                    shots = screenshots(seeds)
                    shots_by_agent = [shots[a * per_agent:(a + 1) * per_agent] for a in range(concurrency)]
                    url = gateways[mode].url if mode in gateways else vllm.url
                    time.sleep(1.0)  # the screenshot workers' exit settles before the timed loop
                    run = asyncio.run(drive(url, api, mode, concurrency, shots_by_agent, f"r{n}-{seeds[0]}", args,
                                            meters, duration))
                    if n < 0:
                        print(f"warm-up {api:9} c={concurrency} {mode:12} {run['turns_per_s']:6.2f} turns/s "
                              f"err {run['errors']}", flush=True)
                        continue
                    run["round"] = n
                    expected[(api, concurrency, mode)] = run["turns_per_s"]
                    runs.append(run)
                    c = run["cpu_per_turn_ms"]
                    print(f"round {n} {api:9} c={concurrency} {mode:12} {run['turns_per_s']:6.2f} turns/s  ttft p50 "
                          f"{pct(run['ttft_ms'], 50):6.1f} p90 {pct(run['ttft_ms'], 90):6.1f} ms (head p50 "
                          f"{pct(run['head_ms'], 50):5.1f}, turn p50 {pct(run['turn_ms'], 50):6.1f})  err {run['errors']}  "
                          f"cpu ms/turn api {c['vllm_api']:5.1f} engine {c['vllm_engine']:5.1f} gw {c['gateway']:5.1f} "
                          f"client {c['client']:5.1f}  misses {run['images_processed_per_turn']:.2f}/turn  load {run['load_1m']:.2f} others {run['others_cpu_s']:.1f} s",
                          flush=True)
    return runs


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (API, C, mode): turns/s the median of its rounds, TTFT pooled over them, CPU
    per turn the median of rounds; ratios against the self-stripping client and direct, pooled and
    paired by round (``paired``)."""
    rows: dict[tuple[str, int, str], dict[str, Any]] = {}
    for run in runs:
        key = (run["api"], run["concurrency"], run["mode"])
        row = rows.setdefault(key, {"api": key[0], "concurrency": key[1], "mode": key[2], "rates": [], "ttft": [],
                                    "errors": 0, "cpu": []})
        row["rates"].append(run["turns_per_s"])
        row["ttft"] += run["ttft_ms"]
        row["errors"] += run["errors"]
        row["cpu"].append(run["cpu_per_turn_ms"])
        row.setdefault("processed", []).append(run["images_processed_per_turn"])
        row.setdefault("loads", []).append(run["load_1m"])
    for row in rows.values():
        row["turns_per_s"] = statistics.median(row["rates"])
        row["ttft_p50_ms"], row["ttft_p90_ms"] = pct(row["ttft"], 50), pct(row["ttft"], 90)
        row["cpu_ms"] = {k: statistics.median(c[k] for c in row["cpu"]) for k in row["cpu"][0]}
        row["images_processed_per_turn"] = statistics.median(row["processed"])
        row["load_1m"] = (min(row["loads"]), max(row["loads"]))  # the machine's, as each run began
        del row["ttft"], row["cpu"], row["processed"], row["loads"]
    by_round = {(r["api"], r["concurrency"], r["mode"], r["round"]): r for r in runs}
    for (api, concurrency, mode), row in rows.items():
        for ref in ("strip", "direct"):
            base = rows.get((api, concurrency, ref))
            row[f"rate_vs_{ref}"] = row["turns_per_s"] / base["turns_per_s"] if base else None
            row[f"p50_vs_{ref}"] = row["ttft_p50_ms"] / base["ttft_p50_ms"] if base else None
            row[f"p90_vs_{ref}"] = row["ttft_p90_ms"] / base["ttft_p90_ms"] if base else None
            row[f"paired_vs_{ref}"] = paired(by_round, (api, concurrency, mode), (api, concurrency, ref))
        # No strip run of this API (Messages: vLLM's takes no uuid): the self-stripping chat client
        # of the same round stands in, the most any client gets from the replica.
        row["paired_vs_chat_strip"] = None if row["paired_vs_strip"] is not None else paired(
            by_round, (api, concurrency, mode), ("chat", concurrency, "strip"))
    return list(rows.values())


def paired(by_round: dict[tuple[str, int, str, int], dict[str, Any]], cell: tuple[str, int, str],
           ref: tuple[str, int, str]) -> dict[str, Any] | None:
    """Per round, ``cell`` ÷ ``ref`` run in the same round (a slow drift cancels): turns/s, TTFT
    p50, p90, their medians and (``*_ci``) geometric mean with its 90% interval."""
    pairs = [(run, by_round[(*ref, n)]) for (*c, n), run in by_round.items()
             if tuple(c) == cell and (*ref, n) in by_round]
    ratios = {"rate": [a["turns_per_s"] / b["turns_per_s"] for a, b in pairs],
              "p50": [pct(a["ttft_ms"], 50) / pct(b["ttft_ms"], 50) for a, b in pairs],
              "p90": [pct(a["ttft_ms"], 90) / pct(b["ttft_ms"], 90) for a, b in pairs]}
    if not pairs:
        return None
    return {**{k: statistics.median(v) for k, v in ratios.items()},
            **{f"{k}_ci": ratio_interval(v) for k, v in ratios.items()}, "rounds": ratios}


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _paired(p: dict[str, Any] | None) -> str:
    return "-" if p is None else f"{p['rate']:.2f} / {p['p50']:.2f} / {p['p90']:.2f}"


def _interval(row: dict[str, Any], stat: str) -> str:
    """``stat``'s paired ratio to strip: geometric mean [90% interval]; * against chat's strip."""
    own = row["paired_vs_strip"] is not None
    p = row["paired_vs_strip"] if own else row["paired_vs_chat_strip"]
    ci = None if p is None or row["mode"] == "strip" else p[f"{stat}_ci"]
    return fmt_interval(ci, "" if own else "*")


COLUMNS = [
    Column("api", 10, lambda r: r["api"], left=True),
    Column("C", 3, lambda r: str(r["concurrency"])),
    Column("  mode", 14, lambda r: "  " + r["mode"], left=True),
    Column("turns/s", 9, lambda r: f"{r['turns_per_s']:.2f}"),
    Column("÷strip", 8, lambda r: _ratio(r["rate_vs_strip"])),
    Column("÷direct", 8, lambda r: _ratio(r["rate_vs_direct"])),
    Column("ttft p50", 10, lambda r: f"{r['ttft_p50_ms']:.0f}"),
    Column("p90", 6, lambda r: f"{r['ttft_p90_ms']:.0f}"),
    Column("p50÷strip", 11, lambda r: _ratio(r["p50_vs_strip"])),
    Column("p90÷strip", 11, lambda r: _ratio(r["p90_vs_strip"])),
    Column("paired ÷strip rate/p50/p90", 28, lambda r: _paired(r["paired_vs_strip"])),
    Column("rate ÷strip 90% CI", 21, lambda r: _interval(r, "rate")),
    Column("p50 ÷strip 90% CI", 21, lambda r: _interval(r, "p50")),
    Column("p90 ÷strip 90% CI", 21, lambda r: _interval(r, "p90")),
    Column("err", 5, lambda r: str(r["errors"])),
    Column("api ms", 8, lambda r: f"{r['cpu_ms']['vllm_api']:.1f}"),
    Column("engine", 8, lambda r: f"{r['cpu_ms']['vllm_engine']:.1f}"),
    Column("gw ms", 7, lambda r: f"{r['cpu_ms']['gateway']:.1f}"),
    Column("miss/turn", 11, lambda r: f"{r['images_processed_per_turn']:.2f}"),
    Column("load", 10, lambda r: "{:.1f}-{:.1f}".format(*r["load_1m"])),
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--apis", default="chat,responses,messages")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--concurrency", default="1,2,4,8", help="agents at once, comma-separated")
    p.add_argument("--duration", type=float, default=20.0, help="seconds per mode and round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--warmup", type=float, default=3.0, help="seconds per mode of an uncounted first round (0: none)")
    p.add_argument("--window", type=int, default=4, help="screenshots per turn")
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--extra-body", type=orjson.loads, default={}, help="JSON fields added to every turn's body")
    p.add_argument("--inline-system", action="store_true",
                   help="Messages: a system message inside `messages` every turn (a per-turn reminder)")
    p.add_argument("--expect-turns-per-s", type=float, default=30.0,
                   help="rate the first round's screenshots are made for (later rounds: the one measured)")
    p.add_argument("--model", type=Path, default=ROOT / "build" / "micro-qwen2vl",
                   help="model directory (default: the capped micro model, `make vllm MODEL=micro`)")
    p.add_argument("--gateway-args", default="", help="extra `mmgate serve` flags")
    p.add_argument("--baseline", type=Path, metavar="SRC",
                   help=f"also run mode {BASELINE_MODE!r}: the unmodified client through a gateway from SRC "
                        "(the src/ of a worktree of an earlier commit)")
    p.add_argument("--out", type=Path)
    args = parse_args(p, QUICK)
    args.apis = args.apis.split(",")
    args.modes = args.modes.split(",")
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    located = VllmSetup.locate()
    setup = VllmSetup(python=located.python, model_dir=args.model, start_timeout_s=located.start_timeout_s)
    if not (args.model / "config.json").exists():
        setup.ensure_model("--preset", "micro")
    tmp = Path(tempfile.mkdtemp(prefix="agent-capacity-"))
    vllm = VllmReplica(setup, tmp / "vllm.log")
    gateway = GatewayProcess(tmp / "gateway.log")
    gateways: dict[str, GatewayProcess] = {"mmgate": gateway, "mmgate-strip": gateway}
    if FLOOR_MODE in args.modes:
        gateways[FLOOR_MODE] = FloorRelay(tmp / "relay.log", int(vllm.url.rsplit(":", 1)[1]))
    if args.baseline is not None:
        gateways[BASELINE_MODE] = GatewayProcess(tmp / "gateway-base.log", src=args.baseline.resolve())
        if BASELINE_MODE not in args.modes:  # named in --modes too: once a round, where it is named
            args.modes.append(BASELINE_MODE)
    print(f"starting vLLM ({args.model.name}) and mmgate; logs in {tmp}", file=sys.stderr, flush=True)
    vllm.start()
    try:
        for g in set(gateways.values()):
            g.start(["--backend", f"vllm={vllm.url}", *args.gateway_args.split()])
        runs = measure(vllm, gateways, args)
    finally:
        for g in set(gateways.values()):
            g.stop()
        vllm.stop()
    rows = summarise(runs)
    print_table(COLUMNS, rows)
    print("CPU columns: ms of CPU per counted turn (median of rounds): vLLM's API server, its engine "
          "processes, the gateway's process tree; miss/turn: vLLM processor-cache misses per turn; "
          "load: the 1-minute load as the row's runs began, lowest-highest")
    print("CI columns: geometric mean of the rounds' paired ratios [its 90% interval]; *: against the "
          "self-stripping chat client of the same round (the API has no strip mode)")
    if args.out:
        write_results(args.out, {"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
