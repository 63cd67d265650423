"""The gateway's CPU per agent turn over HTTP, with a backend that does no work: what a turn costs
mmgate itself, end to end (aiohttp's server and client included), without vLLM's noise.

C agents, each a session of screenshot turns (``_agent_turns``: 1280x800 PNGs, a sliding window
of ``--window``, one new a turn, streamed) through ``mmgate serve`` to a canned backend (an
aiohttp app in its own process that reads each body and answers a short stream in the API's
shape at once). Modes: ``mmgate`` (the unmodified client: every screenshot's bytes, no uuid) and
``mmgate-strip`` (the client labels its screenshots and sends repeats as cache-only references).
Per API and mode: the gateway process tree's CPU per turn (from /proc), turn latency p50/p90, the
load and other processes' CPU beside it. Rounds alternate the order. ``agent_capacity.py`` is the
same turn against real vLLM; this one isolates the gateway's share.

    .venv/bin/python benchmarks/studies/agent_turn_cpu.py --apis chat,responses,messages --turns 60 --rounds 3

``--baseline SRC`` runs the gateway of an earlier tree beside this one (``git worktree add --detach
/tmp/mm-base COMMIT``, then ``--baseline /tmp/mm-base/src``): each run's turns go to one and then
the other, the order alternating, and the table has a row for each. ``--floor`` adds a row for
``benchmarks/servers/bare_relay.py`` on chat: aiohttp's server and client relaying the same turn
(the whole body on, nothing parsed), the floor of any gateway built on them. ``--stream-gap-ms``
spaces the backend's events as an engine's tokens are (each event its own read and write, as
on real vLLM) rather than sending the stream in one write. ``--profile DIR`` samples each
gateway with py-spy for the whole run (``benchmarks/_pyspy.py``) and prints where its turns' time
went, by package and by innermost function, µs a turn; the stacks stay in DIR.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from benchmarks import _pyspy
from benchmarks._agent_turns import PATHS, screenshots, turn_body
from benchmarks._procs import MMGATE, ROOT, cpu_seconds, free_port, machine_busy_s, start, stop, tree_cpu_s
from benchmarks._run import parse_args, write_results
from benchmarks._table import Column, fmt_interval, print_table, ratio_interval

MODEL = "canned-vl"
FLOOR = "bare-relay"
QUICK = {"concurrency": 2, "turns": 6, "rounds": 1}
_CHAT = b"".join([
    b'data: {"id":"c","object":"chat.completion.chunk","model":"canned-vl","choices":[{"index":0,'
    b'"delta":{"role":"assistant","content":""}}]}\n\n',
    *(b'data: {"id":"c","object":"chat.completion.chunk","model":"canned-vl","choices":[{"index":0,'
      b'"delta":{"content":"t%d "}}]}\n\n' % i for i in range(4)),
    b'data: {"id":"c","object":"chat.completion.chunk","model":"canned-vl","choices":[{"index":0,'
    b'"delta":{},"finish_reason":"length"}]}\n\n',
    b'data: {"id":"c","object":"chat.completion.chunk","model":"canned-vl","choices":[],"usage":'
    b'{"prompt_tokens":600,"completion_tokens":4,"total_tokens":604}}\n\n',
    b"data: [DONE]\n\n"])
_RESPONSES = b"".join([
    b'event: response.created\ndata: {"type":"response.created","response":{"id":"resp_c","status":'
    b'"in_progress"}}\n\n',
    *(b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"t%d "}\n\n'
      % i for i in range(4)),
    b'event: response.completed\ndata: {"type":"response.completed","response":{"id":"resp_c","status":'
    b'"completed","usage":{"input_tokens":600,"output_tokens":4,"total_tokens":604}}}\n\n'])


def _answerer(gap_s: float) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def answer(request: web.Request) -> web.StreamResponse:
        await request.read()
        reply = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await reply.prepare(request)
        stream = _RESPONSES if request.path == "/v1/responses" else _CHAT
        for event in stream.split(b"\n\n")[:-1] if gap_s else [stream]:
            await reply.write(event + b"\n\n" if gap_s else event)
            await asyncio.sleep(gap_s)
        await reply.write_eof()
        return reply

    return answer


def serve_backend(port: int, gap_s: float) -> None:
    """The canned backend (its own process): any POST answered at once (its events ``gap_s``
    apart, each in its own write, when not 0), ``/v1/models``, ``/health``."""
    app = web.Application(client_max_size=1 << 30)
    app.router.add_post("/{tail:.*}", _answerer(gap_s))
    app.router.add_get("/v1/models", lambda _r: _json({"object": "list", "data": [
        {"id": MODEL, "object": "model", "owned_by": "bench", "max_model_len": 32768}]}))
    app.router.add_get("/health", lambda _r: _json({}))
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


async def _json(body: Any) -> web.Response:
    return web.json_response(body)


async def agent(http: aiohttp.ClientSession, url: str, api: str, strip: bool, shots: list[str], name: str,
                window: int, out: list[float]) -> None:
    sent: set[str] | None = set() if strip else None
    for t in range(len(shots)):
        first = max(0, t - window + 1)
        body = orjson.dumps(turn_body(api, MODEL, [(f"{name}-{i}", shots[i]) for i in range(first, t + 1)], sent, 4))
        started = time.perf_counter()
        async with http.post(url + PATHS[api], data=body, headers={
                "Content-Type": "application/json", "x-session-id": name}) as resp:
            data = await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"{api} {name} turn {t}: HTTP {resp.status} {data[:300]!r}")
        if t >= window - 1:
            out.append(1000 * (time.perf_counter() - started))


def split_s(pid: int) -> dict[str, float]:
    """The process's CPU seconds so far by where they went: its event-loop thread and its other
    threads, each in user and kernel mode (from /proc/PID/task/*/stat, in clock ticks); and its
    minor page faults (``faults``, a count)."""
    out = dict.fromkeys(("loop_user", "loop_sys", "threads_user", "threads_sys"), 0.0)
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = task.joinpath("stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        who = "loop" if task.name == str(pid) else "threads"
        out["faults"] = out.get("faults", 0.0) + int(fields[7])
        out[f"{who}_user"] += int(fields[11]) / tick
        out[f"{who}_sys"] += int(fields[12]) / tick
    return out


async def run_mode(url: str, gw_pid: int, api: str, strip: bool, shots: list[list[str]], run_id: str,
                   window: int) -> dict[str, Any]:
    lat: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=len(shots))) as http:
        load = os.getloadavg()[0]
        cpu0, busy0, me0, split0 = tree_cpu_s(gw_pid), machine_busy_s(), cpu_seconds(os.getpid()), split_s(gw_pid)
        await asyncio.gather(*(agent(http, url, api, strip, s, f"{run_id}-a{i}", window, lat)
                               for i, s in enumerate(shots)))
        cpu1, busy1, me1, split1 = tree_cpu_s(gw_pid), machine_busy_s(), cpu_seconds(os.getpid()), split_s(gw_pid)
    turns = len(lat)
    return {"api": api, "mode": "mmgate-strip" if strip else "mmgate", "turns": turns,
            "gateway_ms_per_turn": 1000 * (cpu1 - cpu0) / turns,
            "split_ms_per_turn": {k: 1000 * (split1[k] - split0[k]) / turns for k in split0 if k != "faults"},
            "faults_per_turn": (split1["faults"] - split0["faults"]) / turns, "p50_ms": statistics.median(lat),
            "p90_ms": statistics.quantiles(lat, n=10)[-1], "load_1m": load,
            "others_cpu_s": (busy1 - busy0) - (cpu1 - cpu0) - (me1 - me0)}


COLUMNS = [
    Column("api", 10, lambda r: r["api"], left=True), Column("mode", 13, lambda r: r["mode"], left=True),
    Column("gateway", 11, lambda r: r["gateway"], left=True), Column("turns", 7, lambda r: str(r["turns"])),
    Column("gw CPU ms/turn (rounds)", 44, lambda r: r["gateway_ms_per_turn"]),
    Column("this ÷ it [90%]", 20, lambda r: fmt_interval(r["this_vs_it"])),
    Column("turn p50 ms", 12, lambda r: f"{r['p50_ms']:.1f}"), Column("p90 ms", 9, lambda r: f"{r['p90_ms']:.1f}"),
    Column("  load / others s", 48, lambda r: "  " + r["load"], left=True),
]


def this_vs(runs: list[dict[str, Any]], key: tuple[str, str, str]) -> tuple[float, float, float] | None:
    """This tree's CPU a turn ÷ the ``key`` gateway's, run by run in the same round (a drift of the
    machine cancels): geometric mean and 90% interval (``ratio_interval``); None for this tree."""
    api, mode, gateway = key
    if gateway == "this":
        return None
    this = {r["round"]: r["gateway_ms_per_turn"] for r in runs if (r["api"], r["mode"], r["gateway"]) == (api, mode, "this")}
    return ratio_interval([this[r["round"]] / r["gateway_ms_per_turn"] for r in runs
                           if (r["api"], r["mode"], r["gateway"]) == key and r["round"] in this])


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for key in dict.fromkeys((r["api"], r["mode"], r["gateway"]) for r in runs):
        mine = [r for r in runs if (r["api"], r["mode"], r["gateway"]) == key]
        cpu = [r["gateway_ms_per_turn"] for r in mine]
        rows.append({"api": key[0], "mode": key[1], "gateway": key[2], "turns": sum(r["turns"] for r in mine),
                     "gateway_ms_per_turn": f"{statistics.median(cpu):.2f} ({', '.join(f'{c:.2f}' for c in cpu)})",
                     "median_gateway_ms_per_turn": statistics.median(cpu), "this_vs_it": this_vs(runs, key),
                     "p50_ms": statistics.median(r["p50_ms"] for r in mine),
                     "p90_ms": statistics.median(r["p90_ms"] for r in mine),
                     "load": "; ".join(f"{r['load_1m']:.1f}/{r['others_cpu_s']:.1f}" for r in mine)})
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--apis", default="chat,responses,messages")
    p.add_argument("--modes", default="mmgate,mmgate-strip")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--turns", type=int, default=60, help="turns per agent, mode and round")
    p.add_argument("--window", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--gateway-args", default="", help="extra `mmgate serve` flags")
    p.add_argument("--baseline", type=Path, metavar="SRC",
                   help="also run the gateway from SRC (the src/ of a worktree of an earlier commit), side by side")
    p.add_argument("--floor", action="store_true",
                   help="also run benchmarks/servers/bare_relay.py (chat, unmodified client): aiohttp's own "
                        "cost of relaying the turn, parsing nothing and sending the whole body on")
    p.add_argument("--stream-gap-ms", type=float, default=0.0,
                   help="the backend sends each event this long after the last, as an engine streams tokens "
                        "(0: the whole stream in one write)")
    p.add_argument("--profile", type=Path, metavar="DIR",
                   help="sample each gateway with py-spy into DIR and print where its turns' time went")
    p.add_argument("--serve-backend", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path)
    args = parse_args(p, QUICK)
    if args.serve_backend:
        serve_backend(args.serve_backend, args.stream_gap_ms / 1000)
        return 0
    backend_port = free_port()
    backend = start([__file__, "--serve-backend", str(backend_port), "--stream-gap-ms", str(args.stream_gap_ms)],
                    backend_port, command=[sys.executable])
    trees = {"this": str(ROOT / "src")}
    if args.baseline is not None:
        trees["base"] = str(args.baseline.resolve())
    gateways = {}
    for name, src in trees.items():
        port = free_port()
        gateways[name] = (start(["serve", "--port", str(port), "--backend", f"vllm=http://127.0.0.1:{backend_port}",
                                 *args.gateway_args.split()], port, command=MMGATE,
                                env={**os.environ, "PYTHONPATH": src}), f"http://127.0.0.1:{port}")
        print(f"gateway {name} ({src}) pid {gateways[name][0].pid} on port {port}", file=sys.stderr, flush=True)
    if args.floor:
        port = free_port()
        relay = ROOT / "benchmarks" / "servers" / "bare_relay.py"
        gateways[FLOOR] = (start([str(relay), str(port), str(backend_port)], port, command=[sys.executable]),
                           f"http://127.0.0.1:{port}")
    pairs = [(api, mode) for api in args.apis.split(",") for mode in args.modes.split(",")
             if not (api == "messages" and mode == "mmgate-strip")]
    runs: list[dict[str, Any]] = []
    next_seed = 1_000_003
    spies = {}
    try:
        if args.profile is not None:  # inside the try: a missing py-spy must not leave the gateways running
            args.profile.mkdir(parents=True, exist_ok=True)
            for name, (proc, _) in gateways.items():
                spies[name] = _pyspy.start(proc.pid, args.profile / f"{name}.txt")
        for n in range(args.rounds):
            for api, mode in pairs if n % 2 == 0 else pairs[::-1]:
                base = next_seed
                next_seed += args.turns * args.concurrency
                shots = screenshots(list(range(base, next_seed)))
                per_agent = [shots[a * args.turns:(a + 1) * args.turns] for a in range(args.concurrency)]
                names = list(gateways) if (n + len(runs)) % 2 == 0 else list(gateways)[::-1]
                for name in names:
                    if name == FLOOR and (api, mode) != ("chat", "mmgate"):
                        continue  # the relay serves chat only, and forwards what it gets
                    proc, url = gateways[name]
                    time.sleep(0.5)
                    run = asyncio.run(run_mode(url, proc.pid, api, mode == "mmgate-strip", per_agent,
                                               f"r{n}-{api}-{mode}-{name}", args.window))
                    run["round"], run["gateway"] = n, name
                    runs.append(run)
                    print(f"round {n} {api:9} {mode:12} {name:4} gw {run['gateway_ms_per_turn']:5.2f} ms/turn  p50 "
                          f"{run['p50_ms']:6.1f} ms  ("
                          + " ".join(f"{k} {v:.2f}" for k, v in run["split_ms_per_turn"].items())
                          + f")  faults/turn {run['faults_per_turn']:.0f}  load {run['load_1m']:.2f} others {run['others_cpu_s']:.1f} s",
                          flush=True)
    finally:
        for spy in spies.values():
            _pyspy.stop(spy)
        for proc, _ in gateways.values():
            stop(proc)
        stop(backend)
    rows = summarise(runs)
    print_table(COLUMNS, rows)
    profiles = {name: _pyspy.read(args.profile / f"{name}.txt", sum(r["turns"] for r in runs if r["gateway"] == name))
                for name in spies}
    for name, profile in profiles.items():
        _pyspy.print_profile(name, profile)
    if args.out:
        write_results(args.out, {"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs, "rows": rows,
                                 "profiles": profiles})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
