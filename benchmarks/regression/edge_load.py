"""The HTTP edge under hostile load, on loopback: does a normal client stay served?

One ``mmgate serve`` process in front of one ``mmgate sim`` process (a vLLM stand-in, fast timing).
A *normal request* is one chat turn with a small PNG (a new one each time, so it is decoded); it is
sent at a steady rate and its latency recorded, in these phases, side by side in one run:

* ``unloaded``   — nothing else going on;
* ``slowloris``  — N slow connections (default 20,000, from two helper processes of their own) that
                   trickle header bytes and reconnect the moment the edge closes them; measured
                   only once the edge holds all of them, or its cap (the open fds of the process
                   holding the client connections, from /proc/PID/fd, sampled through the window
                   and reported: min and median);
* ``giants``     — 4 clients in a loop, each sending requests of 8 giant-pixel PNGs (6300x6300,
                   ~115 KB each: cheap to send, 40 M pixels to decode);

Each phase runs against one gateway per way of holding connections (``--doors``), side by side,
their order rotating each round: ``aiohttp-alone`` (the gateway exposed directly: aiohttp's server
bounded by its header deadline only), ``nginx`` (a real nginx in front, run from the shipped
``deploy/nginx/`` configuration) and ``NAME=SRC`` (the gateway of another source tree, e.g. a
worktree of an older commit, with its default flags). Each phase's row carries the machine's load
average at its end, and the CPU the gateway and the process in front of it (nginx, or an older
tree's front door) spent per normal request.

And, last, a ``soak``: 256k distinct tiny images (16 a request, each with a uuid) through a gateway
with small cache budgets, reporting its RSS against base + the configured budgets.

Every phase is bounded in time and stops by itself; children are killed on every exit path. Prints
a table and writes JSON (``--out``). ``ulimit -n`` is raised (soft to hard) in every process.

    .venv/bin/python benchmarks/regression/edge_load.py --out bench-out/edge_load.json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import json
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from PIL import Image
from tests.support.nginx import nginx_in_front

from benchmarks._procs import cpu_seconds, free_port, start, stop
from benchmarks._run import parse_args

# --quick: both doors, every phase, a few seconds each (make test runs it: tests/benchmarks/test_quick.py).
QUICK = {"seconds": 1.0, "rate": 10.0, "slow": 200, "helpers": 1, "rounds": 1, "soak": 2048}
MODEL = "mmgate-sim-vl"
MiB = 1024 * 1024


def raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def png_url(width: int, height: int, seed: int, mode: str = "RGB") -> str:
    buf = io.BytesIO()
    color: Any = seed % 256 if mode == "L" else (seed % 256, (seed // 256) % 256, (seed // 65536) % 256)
    Image.new(mode, (width, height), color).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def turn(parts: list[dict[str, Any]]) -> bytes:
    return orjson.dumps({"model": MODEL, "max_tokens": 2,
                         "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}, *parts]}]})


def image_part(url: str, uuid: str | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "image_url", "image_url": {"url": url}}
    if uuid is not None:
        part["uuid"] = uuid
    return part


async def normal_traffic(url: str, seconds: float, rate: float, seed0: int) -> dict[str, Any]:
    """Normal requests at ``rate``/s for ``seconds``; latency percentiles and failures.

    Each request's own connection set-up, when it needed a new one, is timed apart (aiohttp's
    connection trace): a request on a reused keep-alive connection never waits for ``accept()``.
    """
    latencies: list[float] = []
    fresh_latencies: list[float] = []
    connect_ms: list[float] = []
    failures: dict[str, int] = {}

    async def on_create_start(_s: Any, ctx: Any, _p: Any) -> None:
        ctx.trace_request_ctx["connect_started"] = time.perf_counter()

    async def on_create_end(_s: Any, ctx: Any, _p: Any) -> None:
        started = ctx.trace_request_ctx.get("connect_started")
        if started is not None:
            ctx.trace_request_ctx["connect_ms"] = (time.perf_counter() - started) * 1000

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_start.append(on_create_start)
    trace.on_connection_create_end.append(on_create_end)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout, trace_configs=[trace]) as s:

        async def one(i: int) -> None:
            body = turn([image_part(png_url(96, 96, seed0 + i))])
            ctx: dict[str, float] = {}
            started = time.perf_counter()
            try:
                async with s.post(url + "/v1/chat/completions", data=body, trace_request_ctx=ctx,
                                  headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    if r.status != 200:
                        failures[str(r.status)] = failures.get(str(r.status), 0) + 1
                        return
            except (aiohttp.ClientError, TimeoutError) as exc:
                failures[type(exc).__name__] = failures.get(type(exc).__name__, 0) + 1
                return
            latencies.append(time.perf_counter() - started)
            if "connect_ms" in ctx:
                connect_ms.append(ctx["connect_ms"])
                fresh_latencies.append(latencies[-1])

        tasks = []
        begin = time.perf_counter()
        i = 0
        while time.perf_counter() - begin < seconds:
            tasks.append(asyncio.create_task(one(i)))
            i += 1
            await asyncio.sleep(max(0.0, begin + i / rate - time.perf_counter()))
        await asyncio.gather(*tasks)
    ms = sorted(x * 1000 for x in latencies)
    q = statistics.quantiles(ms, n=100) if len(ms) >= 2 else [ms[0] if ms else float("nan")] * 99
    return {"sent": i, "ok": len(ms), "failures": failures, "p50_ms": round(q[49], 1), "p99_ms": round(q[98], 1),
            "max_ms": round(ms[-1], 1) if ms else None,
            "new_connections": len(connect_ms),
            "connect_ms_max": round(max(connect_ms), 1) if connect_ms else None,
            "on_new_connection_max_ms": round(max(fresh_latencies) * 1000, 1) if fresh_latencies else None}


# -- slow connections (in helper processes: each its own fds) ----------------------------------

SLOW_HEAD = b"GET /health HTTP/1.1\r\nHost: x\r\n"


def _slow_worker(port: int, count: int, nice: int, stop: Any, stats: Any) -> None:
    """``count`` slow clients until ``stop`` is set: each trickles one header byte every 2 s and
    never completes its request; the moment the gateway closes it (displaced, refused, timed out)
    it connects again. Puts its counts on ``stats`` when stopped. Runs at ``nice``: the attackers
    share the gateway's two cores here, where a real attacker's CPU would be its own."""
    raise_nofile()
    os.nice(nice)

    async def main() -> None:
        counts = {"opened": 0, "closed_by_server": 0, "answered_503": 0, "connect_errors": 0}
        stopping = asyncio.Event()

        async def hold() -> None:
            while not stopping.is_set():
                try:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                except OSError:
                    counts["connect_errors"] += 1
                    await asyncio.sleep(0.01)  # refused or timed out in the kernel: at once again
                    continue
                counts["opened"] += 1
                try:
                    writer.write(SLOW_HEAD)
                    while not stopping.is_set():
                        writer.write(b"X")  # one header byte now and then: never a full request
                        await writer.drain()
                        try:
                            data = await asyncio.wait_for(reader.read(1024), 2.0)
                        except TimeoutError:
                            continue
                        if data.startswith(b"HTTP/1.1 503"):
                            counts["answered_503"] += 1
                        if data == b"" or data.startswith(b"HTTP/"):
                            counts["closed_by_server"] += 1
                            break
                except OSError:
                    counts["closed_by_server"] += 1
                finally:
                    writer.close()

        async def watch_stop() -> None:
            await asyncio.to_thread(stop.wait)
            stopping.set()

        watcher = asyncio.create_task(watch_stop())
        tasks = []
        for _ in range(count):
            tasks.append(asyncio.create_task(hold()))
            if len(tasks) % 500 == 0:
                await asyncio.sleep(0.05)
        await watcher
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        stats.put(counts)

    asyncio.run(main())


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def children(pid: int) -> list[int]:
    """``pid``'s child processes (nginx's workers; an older gateway's front door)."""
    out: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(x) for x in f.read().split()]
    return out


def open_fds(pid: int) -> int:
    """Open fds of ``pid`` and its children: the client connections nginx's workers or a front door
    hold count too.

    Linux 6.2+ gives the count as the size of ``/proc/PID/fd`` (0.07 ms at 8,192 fds); listing the
    directory instead takes ~37 ms there, and done every 0.25 s on this process's event loop it
    delayed the normal requests being measured (older kernels: the listing, the delay with it)."""
    total = 0
    for p in (pid, *children(pid)):
        with contextlib.suppress(OSError):
            total += os.stat(f"/proc/{p}/fd").st_size or len(os.listdir(f"/proc/{p}/fd"))
    return total


async def with_slow_connections(
    door: Door, total: int, seconds: float, rate: float, cap: int,
    helpers: int = 2, nice: int = 0, ramp_s: float = 120.0,
) -> dict[str, Any]:
    """Normal traffic while ``total`` slow clients (in ``helpers`` processes) hold ``door`` at
    ``cap`` client connections: measured only once the open fds of the process holding them have
    reached it, and those fds sampled every 0.25 s through the window."""
    url, port, holder = door.url, door.port, door.holder_pid
    base_fds = open_fds(holder)  # listener, epoll, backend pool, logs: everything but clients
    ctx = multiprocessing.get_context("spawn")
    stats = ctx.Queue()
    stop = ctx.Event()
    per = [total // helpers + (1 if k < total % helpers else 0) for k in range(helpers)]
    workers = [ctx.Process(target=_slow_worker, args=(port, count, nice, stop, stats), daemon=True) for count in per]
    for p in workers:
        p.start()
    result: dict[str, Any] = {}
    try:
        ramp_started = time.monotonic()
        # The gateway holds at most ``cap`` client connections (one more while a displaced one closes).
        result["cap_reached"] = False
        while time.monotonic() - ramp_started < ramp_s:
            if open_fds(holder) - base_fds >= 0.99 * cap:
                result["cap_reached"] = True
                break
            await asyncio.sleep(0.25)
        result["ramp_s"] = round(time.monotonic() - ramp_started, 1)
        log(f"slowloris: {open_fds(holder) - base_fds} client connections after {result['ramp_s']} s")
        samples: list[int] = []

        async def count_fds() -> None:
            while True:
                samples.append(open_fds(holder) - base_fds)
                await asyncio.sleep(0.25)

        counter = asyncio.create_task(count_fds())
        worker_pids = [p.pid for p in workers if p.pid is not None]  # all started above
        helpers_before = sum(cpu_seconds(pid) for pid in worker_pids)
        window_started = time.perf_counter()
        result.update(await door.measured(normal_traffic(url, seconds, rate, 10_000)))
        window = time.perf_counter() - window_started
        counter.cancel()
        result["helpers_cpu_cores"] = round((sum(cpu_seconds(pid) for pid in worker_pids) - helpers_before) / window, 2)
        result["client_conns_min"] = min(samples)
        result["client_conns_median"] = statistics.median(samples)
        result["client_conns_samples"] = len(samples)
        # At the cap: within 1% of it (a displaced connection still closing frees its fd a moment later).
        result["at_cap_share"] = round(sum(1 for x in samples if x >= 0.99 * cap) / len(samples), 3)
    finally:
        stop.set()
        helper_counts = []
        for _ in workers:
            try:
                helper_counts.append(await asyncio.to_thread(stats.get, True, 30))
            except Exception:  # a helper that died: its counts are lost, the others still count
                pass
        for p in workers:
            p.join(10)
            if p.is_alive():
                p.kill()
    result["slow_clients"] = {k: sum(c[k] for c in helper_counts) for k in helper_counts[0]} if helper_counts else {}
    result["slow_connections"] = total
    result["cap"] = cap
    return result


# -- giant images ----------------------------------------------------------------------------

async def with_giants(url: str, seconds: float, rate: float, round_: int = 0) -> dict[str, Any]:
    giants = [png_url(6300, 6300, 8 * round_ + seed, mode="L") for seed in range(8)]  # new ones each round
    body = turn([image_part(g) for g in giants])
    stop_at = time.perf_counter() + seconds + 2
    answers: dict[str, int] = {}

    async def giant_client(s: aiohttp.ClientSession) -> None:
        while time.perf_counter() < stop_at:
            async with s.post(url + "/v1/chat/completions", data=body,
                              headers={"Content-Type": "application/json"}) as r:
                await r.read()
                answers[str(r.status)] = answers.get(str(r.status), 0) + 1
                if r.status != 200:  # a client that retries its refused request a second later
                    await asyncio.sleep(float(r.headers.get("Retry-After", "1")))

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
        load = [asyncio.create_task(giant_client(s)) for _ in range(4)]
        await asyncio.sleep(1)
        result = await normal_traffic(url, seconds, rate, 20_000)
        await asyncio.gather(*load, return_exceptions=True)
    result["giant_answers"] = answers
    result["giant_png_bytes"] = len(giants[0]) * 3 // 4
    return result


# -- RSS soak ----------------------------------------------------------------------------------

def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and its children (decode workers, an older tree's front door)."""
    total = 0
    for p in (pid, *children(pid)):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


async def soak(url: str, pid: int, images: int, per_request: int, concurrency: int) -> dict[str, Any]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        async def send(start_index: int) -> int:
            parts = [image_part(png_url(4, 4, start_index + k), uuid=f"soak-{start_index + k}")
                     for k in range(per_request)]
            async with s.post(url + "/v1/chat/completions", data=turn(parts),
                              headers={"Content-Type": "application/json"}) as r:
                await r.read()
                return r.status

        await send(10**9)  # warm: imports, pools, first allocations
        base = rss_bytes(pid)
        statuses: dict[int, int] = {}
        peak = base
        queue = list(range(0, images, per_request))
        started = time.perf_counter()

        async def worker() -> None:
            nonlocal peak
            while queue:
                status = await send(queue.pop())
                statuses[status] = statuses.get(status, 0) + 1
                if len(queue) % 500 == 0:
                    peak = max(peak, rss_bytes(pid))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        end = rss_bytes(pid)
    return {"images": images, "seconds": round(time.perf_counter() - started, 1), "statuses": statuses,
            "base_rss_mib": round(base / MiB, 1), "end_rss_mib": round(end / MiB, 1),
            "peak_rss_mib": round(max(peak, end) / MiB, 1)}


def bounded_entry_bytes() -> tuple[int, int]:
    """Real bytes per entry (tracemalloc, keys included) of the two count-bounded parts of the
    record of what each backend holds: the images held (per backend) and who showed each image."""
    import hashlib
    import tracemalloc

    from mmgate.fleet import BackendHoldings

    n = 20_000
    out = []
    for fill in ("tracker", "history"):
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        keys = ["~sha256:" + hashlib.sha256(str(i).encode()).hexdigest() for i in range(n)]
        holdings = BackendHoldings(4 * 1024**3, max_entries=n, max_keys=n)
        for k in keys:
            if fill == "tracker":
                holdings.hold("vllm-0", [(k, 1024)])
            else:
                holdings.show([k], -1)
        out.append((tracemalloc.get_traced_memory()[0] - before) // n)
        tracemalloc.stop()
    return out[0], out[1]


@dataclass
class Door:
    """One way of holding client connections, in front of one gateway: ``url``/``port`` is where
    clients connect, ``holder_pid`` the process (with its children) holding their connections,
    ``front_pids`` the processes in front of the gateway (nginx's, an older tree's front door)."""

    name: str
    gateway: subprocess.Popen[bytes]
    url: str
    port: int
    holder_pid: int
    front_pids: Callable[[], list[int]] = field(default=list)

    async def measured(self, traffic: Awaitable[dict[str, Any]]) -> dict[str, Any]:
        """``traffic``'s result with the CPU the gateway and the front spent on average (cores) and
        per answered request (ms) during it."""
        pids = self.front_pids()
        before = cpu_seconds(self.gateway.pid), sum(cpu_seconds(p) for p in pids)
        started = time.perf_counter()
        result = await traffic
        window = time.perf_counter() - started
        spent = cpu_seconds(self.gateway.pid) - before[0], sum(cpu_seconds(p) for p in pids) - before[1]
        ok = max(result["ok"], 1)
        result["gateway_cpu_cores"] = round(spent[0] / window, 2)
        result["front_cpu_cores"] = round(spent[1] / window, 2)
        result["gateway_cpu_ms_per_request"] = round(spent[0] * 1000 / ok, 2)
        result["front_cpu_ms_per_request"] = round(spent[1] * 1000 / ok, 2)
        return result


def door_cap(door: str, src: str, cap: int, slow: int) -> int:
    """The client connections ``door`` holds under ``slow`` slow clients: an older tree's capped
    gateway holds ``cap``; aiohttp alone and nginx hold every one until its header deadline."""
    return min(cap, slow) if src else slow


def open_door(name: str, src: str, sim_port: int, cap: int, stack: contextlib.ExitStack, scratch: Path) -> Door:
    """Start ``name``'s gateway (and nginx in front for ``nginx``); stopped when ``stack`` closes."""
    port = free_port()
    # NAME=SRC: the gateway of another source tree, with its default flags and the cap given.
    extra = ["--max-connections", str(cap)] if src else []
    env = {**os.environ, "PYTHONPATH": src} if src else None  # made absolute in main()
    gateway = start(gateway_args(port, sim_port, extra), port, env=env)
    stack.callback(stop, gateway)
    url = f"http://127.0.0.1:{port}"
    if src:
        return Door(name, gateway, url, port, gateway.pid, lambda: children(gateway.pid))
    if name == "nginx":
        directory = scratch / "nginx"
        directory.mkdir()
        nginx, front_port = stack.enter_context(nginx_in_front(directory, port))
        return Door(name, gateway, f"http://127.0.0.1:{front_port}", front_port, nginx.pid,
                    lambda: [nginx.pid, *children(nginx.pid)])
    if name != "aiohttp-alone":
        raise SystemExit(f"--doors: unknown door {name!r} (aiohttp-alone, nginx or NAME=SRC)")
    return Door(name, gateway, url, port, gateway.pid)


def gateway_args(port: int, backend_port: int, extra: list[str]) -> list[str]:
    return ["serve", "--port", str(port), "--backend", f"vllm=http://127.0.0.1:{backend_port}",
            "--log-level", "warning", *extra]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    nofile = raise_nofile()
    sim_port = free_port()
    sim = start(["sim", "--port", str(sim_port), "--speedup", "1000"], sim_port, health="/health")
    out: dict[str, Any] = {"ulimit_n": nofile, "phases": {}}
    try:
        specs = [spec.partition("=") for spec in args.doors.split(",")]
        names = [name for name, _, _ in specs]
        with contextlib.ExitStack() as stack:
            scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="edge-load-")))
            doors = {name: open_door(name, src, sim_port, args.max_connections, stack, scratch)
                     for name, _, src in specs}
            caps = {name: door_cap(name, src, args.max_connections, args.slow) for name, _, src in specs}
            rounds: dict[str, list[dict[str, Any]]] = {}
            for door in doors.values():
                await normal_traffic(door.url, 3, args.rate, 900_000)  # warm-up: pools, first connections
            for r in range(args.rounds):  # phases alternate, so a noisy machine hits them all alike
                log(f"round {r + 1} of {args.rounds}")
                for name in names[r % len(names):] + names[:r % len(names)]:  # the doors' order rotates
                    door = doors[name]
                    prefix = "" if len(names) == 1 else f"{name}:"
                    rounds.setdefault(prefix + "unloaded", []).append(loaded(await door.measured(
                        normal_traffic(door.url, args.seconds, args.rate, r * 100_000 + 50_000 * names.index(name)))))
                    if args.slow:
                        rounds.setdefault(prefix + "slowloris", []).append(loaded(
                            await with_slow_connections(door, args.slow, args.seconds, args.rate, caps[name],
                                                       args.helpers, args.helper_nice)))
                        await asyncio.sleep(2)
                    if args.giants:
                        rounds.setdefault(prefix + "giants", []).append(
                            loaded(await door.measured(with_giants(door.url, args.seconds, args.rate, r))))
                if args.out:  # the rounds so far, should a later one not finish
                    write_json(args.out.with_suffix(".partial.json"), {"rounds": rounds})
            out["rounds"] = rounds
            out["phases"] = {name: summary(results) for name, results in rounds.items()}
        if args.soak:
            budgets = {"--local-cache-bytes": 64 * MiB, "--uuid-store-bytes": 32 * MiB, "--reuse-tracked-uuids": 65536}
            port = free_port()
            extra = [a for k, v in budgets.items() for a in (k, str(v))]
            gw = start(gateway_args(port, sim_port, extra), port)
            try:
                result = await soak(f"http://127.0.0.1:{port}", gw.pid, args.soak, 16, 8)
            finally:
                stop(gw)
            per_tracked, per_history = bounded_entry_bytes()
            tracker = budgets["--reuse-tracked-uuids"] * per_tracked  # one backend
            history = budgets["--reuse-tracked-uuids"] * per_history  # who showed each image: as many keys
            caches = budgets["--local-cache-bytes"] + budgets["--uuid-store-bytes"]
            budget = caches + tracker + history
            result["budgets_mib"] = round(budget / MiB, 1)
            result["budget_parts_mib"] = {"caches": round(caches / MiB, 1), "sent_tracker": round(tracker / MiB, 1),
                                          "routing_history": round(history / MiB, 1)}
            result["limit_mib"] = round(result["base_rss_mib"] + 1.25 * budget / MiB, 1)
            result["within"] = result["peak_rss_mib"] <= result["limit_mib"]
            out["soak"] = result
    finally:
        stop(sim)
    return out


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))


def loaded(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` with the machine's 1-minute load average at its end."""
    result["load_1m"] = round(os.getloadavg()[0], 2)
    return result


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One phase over its rounds: medians of the per-round percentiles, totals of the counts."""
    failures: dict[str, int] = {}
    for r in results:
        for k, v in r["failures"].items():
            failures[k] = failures.get(k, 0) + v
    out = {"sent": sum(r["sent"] for r in results), "ok": sum(r["ok"] for r in results), "failures": failures,
           "p50_ms": statistics.median(r["p50_ms"] for r in results),
           "p99_ms": statistics.median(r["p99_ms"] for r in results),
           "p99_per_round": [r["p99_ms"] for r in results],
           "max_ms": max(r["max_ms"] or 0 for r in results)}
    out["new_connections"] = sum(r["new_connections"] for r in results)
    out["connect_ms_max"] = max((r["connect_ms_max"] or 0) for r in results)
    for key in ("load_1m", "giant_answers", "slow_clients", "client_conns_min", "client_conns_median",
                "at_cap_share", "cap_reached", "ramp_s", "gateway_cpu_cores", "front_cpu_cores",
                "gateway_cpu_ms_per_request", "front_cpu_ms_per_request", "helpers_cpu_cores"):
        if key in results[0]:
            out[key] = [r[key] for r in results]
    for key in ("slow_connections", "cap"):
        if key in results[0]:
            out[key] = results[0][key]
    return out


def report(out: dict[str, Any]) -> None:
    phases = out["phases"]

    def door_of(name: str) -> str:
        return name.rsplit(":", 1)[0] + ":" if ":" in name else ""

    print("medians over rounds of each round's percentiles; p99 per round in brackets")
    print(f"{'phase':22s} {'sent':>6s} {'ok':>6s} {'p50 ms':>8s} {'p99 ms':>8s} {'max ms':>8s} {'p99/unloaded':>13s}  "
          "p99 per round; failures; load per round")
    for name, r in phases.items():
        base = phases[door_of(name) + "unloaded"]["p99_ms"]
        print(f"{name:22s} {r['sent']:6d} {r['ok']:6d} {r['p50_ms']:8.1f} {r['p99_ms']:8.1f} {r['max_ms']:8.1f} "
              f"{r['p99_ms'] / base:13.2f}  {r['p99_per_round']} {r['failures'] or ''} load {r['load_1m']}")
    for name, r in phases.items():
        if name.endswith("giants"):
            print(f"{name}: giant requests answered:", r["giant_answers"])
    print("normal requests that opened a new connection:",
          {name: (r["new_connections"], f"slowest connect {r['connect_ms_max']} ms") for name, r in phases.items()})
    for name, sl in phases.items():
        if not name.endswith("slowloris"):
            continue
        print(f"{name}: {sl['slow_connections']} slow clients, {sl['cap']} held at most; per round: "
              f"reached {sl['cap_reached']} after {sl['ramp_s']} s; client connections held (open fds of the "
              f"process holding them and its children, less their own) min {sl['client_conns_min']}, median "
              f"{sl['client_conns_median']}, share of samples at the cap {sl['at_cap_share']}")
        print("  CPU cores busy: gateway", sl["gateway_cpu_cores"], "in front", sl["front_cpu_cores"],
              "slow-client processes", sl["helpers_cpu_cores"])
        print("  slow clients (whole phase):", sl["slow_clients"])
    print("CPU per normal request, ms (gateway + in front), per round:")
    for name, r in phases.items():
        print(f"  {name:22s} {r['gateway_cpu_ms_per_request']} + {r['front_cpu_ms_per_request']}")
    if "soak" in out:
        s = out["soak"]
        print(f"soak: {s['images']} images in {s['seconds']} s, statuses {s['statuses']}; RSS base {s['base_rss_mib']} MiB, "
              f"peak {s['peak_rss_mib']} MiB, end {s['end_rss_mib']} MiB; budgets {s['budgets_mib']} MiB "
              f"{s['budget_parts_mib']} -> limit base + 1.25 x budgets = {s['limit_mib']} MiB: "
              f"{'within' if s['within'] else 'OVER'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=15, help="length of each measured phase")
    parser.add_argument("--rate", type=float, default=20, help="normal requests per second")
    parser.add_argument("--slow", type=int, default=20_000, help="slow connections (0: skip)")
    parser.add_argument("--helpers", type=int, default=2, help="processes the slow connections come from")
    parser.add_argument("--helper-nice", type=int, default=0,
                        help="niceness of the slow-connection processes (19: they get only spare CPU)")
    parser.add_argument("--max-connections", type=int, default=8192,
                        help="--max-connections of the gateways of other trees (NAME=SRC doors): the connections "
                        "they hold at most")
    parser.add_argument("--giants", type=int, default=1, help="1: run the giant-image phase, 0: skip")
    parser.add_argument("--doors", default="aiohttp-alone,nginx",
                        help="comma-separated: aiohttp-alone (the gateway exposed directly: keep --slow under "
                        "ulimit -n), nginx (a real nginx in front, deploy/nginx/) and/or NAME=SRC (the gateway "
                        "of the source tree SRC, e.g. a worktree of an older commit, its default flags and "
                        "--max-connections); each its own gateway, side by side in every round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the alternating phases")
    parser.add_argument("--soak", type=int, default=256 * 1024, help="tiny images in the RSS soak (0: skip)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parse_args(parser, QUICK)
    args.doors = ",".join(f"{n}={Path(src).resolve()}" if src else n
                          for n, _, src in (d.partition("=") for d in args.doors.split(",")))
    out = asyncio.run(run(args))
    report(out)
    if args.out:
        write_json(args.out, out)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
