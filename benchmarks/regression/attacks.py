"""A victim tenant's latency under each attack another tenant can make, the gateway's memory under
compressed bodies, and whether one tenant can tell that another sent an image.

One ``mmgate sim`` (``--speedup 20``) and one ``mmgate serve`` (two tenants, an admin key,
``--max-inflation-ratio 20``: compressed bodies allowed, the costlier setting;
``--stream-stall-timeout 5``; a 16 MiB uuid store), all on loopback. The victim sends one request
after another: a chat turn with a new 64x64 PNG and a cache-only reference to one of its 8 uuids
(sent with their bytes before the first phase). Each phase runs ``--seconds`` with the attacker,
in a process of its own, doing one thing:

* ``unread streams``: 32 streamed requests of 20,000 tokens whose client never reads (a 4 KiB
  receive buffer), opened again every 5 s;
* ``compressed bodies``: 4 at a time, a 250 KB gzip body that inflates to 256 MiB;
* ``decode bombs``: 2 at a time, requests of two new progressive JPEGs of 90 repeated scans
  (2000x2000: under the structure check's limit and the CPU budget, ~0.25 s of decode each);
* ``uuid flood``: 4 at a time, requests of 4 new 256x256 noise PNGs, each with a new uuid.

Two controls tell the gateway's share of the victim's delay from the machine's (attacker, victim,
sim and gateway share its cores): between its gateway requests the victim sends the same chat
turn without the uuid reference (a new 64x64 PNG) to the sim directly (``direct``: what the load
does to the engine and the machine, no gateway in the path), and next to the gateway's
``GET /health`` (every 50 ms: the gateway's event loop, no backend in it) the same probe asks an
idle aiohttp process of its own (``idle proc``: the machine's scheduling delay alone).

The table: the victim's requests, errors, p50 and p99, p99 over the unloaded phase's, the direct
requests' p99 and its ratio, the two probes' p99, the gateway process's RSS at the phase's start
and its growth (peak in the phase over the start), and the CPU seconds the gateway and the sim
spent in the phase, and the attacker's requests answered a second (none for the streams, which
are never answered whole).

Then the side channel, over ``--tries`` tries of a new image each: tenant A sends it, then tenant
B sends the same image. So that the two cases differ in nothing else, they are two worlds: a
second gateway and sim like the first (one tenant secret); A sends the image in one of them (each
in turn) and, in the other, another image of its size (only the image differs) or nothing (A's
activity differs too), and B asks both (each first in turn). B compares its status, headers (all but ``Date`` and the random ``X-Request-Id``) and body (all but ``id`` and
``created``) between the two, its latency (medians, and how often the world where A sent was the
faster), and tries ``/metrics`` with its key.

``--src DIR``: the gateway and the sim run the source tree at DIR (its ``src``; default this
checkout's), so one tree can be measured beside another (a detached worktree of main: before and
after a change). ``--phases``: only the attacks named (the unloaded phase always runs).

    .venv/bin/python benchmarks/regression/attacks.py --seconds 8 --out results/attacks.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gzip
import io
import multiprocessing
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from PIL import Image
from tests.support.bombs import many_scans
from tests.support.images import data_url, png_data_url

from benchmarks._procs import ROOT, cpu_seconds, free_port, start, stop
from benchmarks._run import parse_args, write_results
from benchmarks._table import Column, pct, render

MODEL = "mmgate-sim-vl"
VICTIM, ATTACKER = "key-victim", "key-attacker"
ADMIN = "admin-secret-0123456789"
ATTACKS = ("unloaded", "unread streams", "compressed bodies", "decode bombs", "uuid flood")
QUICK = {"seconds": 0.5, "tries": 2, "phases": "decode bombs"}
MiB = 1024 * 1024


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def chat(*parts: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 2, **extra,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "describe"}, *parts]}]}


def image(url: str | None, uuid: str | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "image_url", "image_url": {"url": url} if url is not None else None}
    if uuid is not None:
        part["uuid"] = uuid
    return part


def noise_png(seed: int, side: int = 256) -> str:
    rng = random.Random(seed)
    img = Image.frombytes("RGB", (side, side), rng.randbytes(side * side * 3))
    buf = io.BytesIO()
    img.save(buf, "PNG", compress_level=1)
    return data_url(buf.getvalue(), "image/png")


# -- the attacker (a process of its own: its CPU is not the victim's client's) ----------------------

def attacker_main(attack: str, url: str, port: int, seconds: float, answered: Any) -> None:
    asyncio.run(_attack(attack, url, port, seconds, answered))


async def _attack(attack: str, url: str, port: int, seconds: float, answered: Any) -> None:
    """``answered``: a shared counter of the attacker's requests answered (any status)."""
    deadline = time.monotonic() + seconds
    if attack == "unread streams":
        await _unread_streams(port, deadline)
        return
    bodies = {"compressed bodies": _gzip_bomb, "decode bombs": _decode_bombs, "uuid flood": _uuid_flood}[attack]
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async def worker(n: int) -> None:
            i = 0
            while time.monotonic() < deadline:
                i += 1
                data, headers = bodies(n * 1_000_000 + i)
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.post(url + "/v1/chat/completions", data=data,
                                            headers={**auth(ATTACKER), **headers}) as r:
                        await r.read()
                        with answered.get_lock():
                            answered.value += 1

        await asyncio.gather(*(worker(n) for n in range(4 if attack != "decode bombs" else 2)))


@functools.cache
def _bomb_gz() -> bytes:
    return gzip.compress(b"\0" * 256 * MiB, 9)


@functools.cache
def _jpeg_url() -> str:
    jpeg = many_scans(90, 2000)
    return data_url(jpeg + b"\0" * (-len(jpeg) % 3), "image/jpeg")  # whole base64 groups: more can follow


def _gzip_bomb(_i: int) -> tuple[bytes, dict[str, str]]:
    return _bomb_gz(), {"Content-Encoding": "gzip", "Content-Type": "application/json"}


def _decode_bombs(i: int) -> tuple[bytes, dict[str, str]]:
    # Bytes after the end marker make each a new image to the caches (decoders ignore them).
    urls = [_jpeg_url() + data_url(f"{i:05}{k}".encode()[-6:], "").split(",", 1)[1] for k in range(2)]
    return orjson.dumps(chat(*(image(u) for u in urls))), {"Content-Type": "application/json"}


def _uuid_flood(i: int) -> tuple[bytes, dict[str, str]]:
    parts = [image(noise_png(i * 8 + k), f"flood-{i}-{k}") for k in range(4)]
    return orjson.dumps(chat(*parts)), {"Content-Type": "application/json"}


async def _unread_streams(port: int, deadline: float) -> None:
    body = orjson.dumps({"model": MODEL, "stream": True, "max_tokens": 20_000, "ignore_eos": True,
                         "messages": [{"role": "user", "content": "tell me everything"}]})
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ATTACKER}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    held: list[socket.socket] = []
    while time.monotonic() < deadline:
        for sock in held:
            sock.close()
        held = []
        for _ in range(32):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            sock.sendall(head + body)
            held.append(sock)
        await asyncio.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
    for sock in held:
        sock.close()


# -- the victim and the measurements -------------------------------------------------------------

class RssSampler:
    """The gateway process's resident memory, sampled every 20 ms in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self.start_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.rss())
            time.sleep(0.02)

    def __enter__(self) -> RssSampler:
        self.start_rss = self.rss()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


IDLE_SERVER = """
import sys
from aiohttp import web
app = web.Application()
app.router.add_get("/health", lambda request: web.Response(text="ok"))
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


async def health_probe(url: str, stop: asyncio.Event) -> list[float]:
    """``GET /health`` every 50 ms on a connection of its own: the gateway's own delay, no backend
    (or, for the idle process, the machine's)."""
    latencies = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        while not stop.is_set():
            t0 = time.perf_counter()
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(url + "/health") as r:
                    await r.read()
            latencies.append(1000 * (time.perf_counter() - t0))
            await asyncio.sleep(0.05)
    return latencies


async def _timed_post(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
                      headers: dict[str, str]) -> tuple[float, bool]:
    t0 = time.perf_counter()
    try:
        async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
            await r.read()
            ok = r.status == 200
    except (aiohttp.ClientError, TimeoutError):
        ok = False
    return 1000 * (time.perf_counter() - t0), ok


async def victim(session: aiohttp.ClientSession, url: str, sim_url: str, seconds: float,
                 seed: list[int], slow: list[tuple[float, int]]) -> tuple[list[float], int, list[float]]:
    """The victim's requests through the gateway, each followed by the control request to the sim
    directly: (gateway latencies, gateway errors, direct latencies); ``slow`` gets (seconds into the
    phase, ms) of each gateway request over a second."""
    latencies: list[float] = []
    direct: list[float] = []
    errors = 0
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        seed[0] += 1
        sent_at = time.monotonic() - started
        ms, ok = await _timed_post(session, url, chat(image(png_data_url(seed[0], 64)), image(None, f"mine-{seed[0] % 8}")),
                                   auth(VICTIM))
        latencies.append(ms)
        if ms > 1000:
            slow.append((round(sent_at, 2), round(ms)))
        errors += not ok
        await asyncio.sleep(0.01)
        seed[0] += 1
        direct.append((await _timed_post(session, sim_url, chat(image(png_data_url(seed[0], 64))), {}))[0])
        await asyncio.sleep(0.01)
    return latencies, errors, direct


async def run_phases(url: str, port: int, pid: int, sim_pid: int, sim_url: str, idle_url: str,
                     seconds: float, attacks: tuple[str, ...] = ATTACKS) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    seed = [10_000]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        for k in range(8):  # the victim's uuids, with their bytes
            async with session.post(url + "/v1/chat/completions", json=chat(image(png_data_url(900 + k, 64), f"mine-{k}")),
                                    headers=auth(VICTIM)) as r:
                assert r.status == 200, await r.text()
        for attack in attacks:
            attacker = None
            context = multiprocessing.get_context("spawn")
            answered = context.Value("l", 0)
            if attack != "unloaded":
                attacker = context.Process(target=attacker_main, args=(attack, url, port, seconds + 1.0, answered))
                attacker.start()
                await asyncio.sleep(1.0)
            cpu = (cpu_seconds(pid), cpu_seconds(sim_pid))
            answered_before, phase_started = answered.value, time.monotonic()
            stop = asyncio.Event()
            probe = asyncio.create_task(health_probe(url, stop))
            idle_probe = asyncio.create_task(health_probe(idle_url, stop))
            with RssSampler(pid) as rss:
                slow: list[tuple[float, int]] = []
                latencies, errors, direct = await victim(session, url, sim_url, seconds, seed, slow)
            stop.set()
            health, idle = await probe, await idle_probe
            attacker_rate = (answered.value - answered_before) / (time.monotonic() - phase_started)
            cpu = (cpu_seconds(pid) - cpu[0], cpu_seconds(sim_pid) - cpu[1])
            if attacker is not None:
                attacker.join(timeout=30)
                if attacker.is_alive():
                    attacker.kill()
            print(f"{attack}: {len(latencies)} requests, {errors} errors", file=sys.stderr, flush=True)
            rows.append({"attack": attack, "n": len(latencies), "errors": errors,
                         "p50_ms": statistics.median(latencies), "p99_ms": pct(latencies, 99),
                         "rss_start_mib": rss.start_rss / MiB, "rss_growth_mib": (rss.peak - rss.start_rss) / MiB,
                         "gateway_cpu_s": cpu[0], "sim_cpu_s": cpu[1], "health_p99_ms": pct(health, 99),
                         "direct_n": len(direct), "direct_p50_ms": statistics.median(direct),
                         "direct_p99_ms": pct(direct, 99), "idle_health_p99_ms": pct(idle, 99),
                         "attacker_answers_per_s": attacker_rate, "slow_requests": slow})
            await asyncio.sleep(min(2.0, seconds))  # what the attack left running drains
    base, direct_base = rows[0]["p99_ms"], rows[0]["direct_p99_ms"]
    for row in rows:
        row["p99_vs_unloaded"] = row["p99_ms"] / base
        row["direct_p99_vs_unloaded"] = row["direct_p99_ms"] / direct_base
    return rows


async def side_channel(worlds: list[str], tries: int, *, decoy: bool) -> dict[str, Any]:
    """Two identical worlds (a gateway and its sim each, one tenant secret): in one, tenant A sends
    each try's new image first, in the other another image (``decoy``) or nothing; then tenant B
    sends it in both. Every difference between B's two answers is something B could learn from."""
    volatile_headers = {"date", "x-request-id"}  # a request id is 128 random bits, new each time
    volatile_fields = {"id", "created"}
    differing: set[str] = set()
    differing_tries = 0
    ms: dict[bool, list[float]] = {True: [], False: []}
    statuses: set[int] = set()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        async def send(url: str, key: str, body: dict[str, Any]) -> tuple[float, int, dict[str, str], dict[str, Any]]:
            t0 = time.perf_counter()
            async with session.post(url + "/v1/chat/completions", json=body, headers=auth(key)) as r:
                raw = await r.read()
                return (1000 * (time.perf_counter() - t0), r.status,
                        {k.lower(): v for k, v in r.headers.items() if k.lower() not in volatile_headers},
                        {k: v for k, v in orjson.loads(raw).items() if k not in volatile_fields})

        for i in range(tries):
            secret = chat(image(noise_png(50_000 + i + 1000 * decoy, 128)))
            # Which world A sends in, and which B asks first, alternate: neither world's own speed
            # (one ran the attacks) can pass for a signal.
            world = {True: worlds[i % 2], False: worlds[1 - i % 2]}
            # Tenant A (the attacker's key stands for it) sends the image in one world and another
            # image of its size in the other: both worlds are as busy, only the image differs.
            await send(world[True], ATTACKER, secret)
            if decoy:
                await send(world[False], ATTACKER, chat(image(noise_png(70_000 + i + 1000 * tries, 128))))
            answers = {}
            for sent in ((True, False) if (i // 2) % 2 else (False, True)):
                answers[sent] = await send(world[sent], VICTIM, secret)
                ms[sent].append(answers[sent][0])
                statuses.add(answers[sent][1])
            (_, s1, h1, b1), (_, s2, h2, b2) = answers[True], answers[False]
            diff = {"status"} if s1 != s2 else set()
            diff |= {f"header {k}" for k in h1.keys() | h2.keys() if h1.get(k) != h2.get(k)}
            diff |= {f"body {k}" for k in b1.keys() | b2.keys() if b1.get(k) != b2.get(k)}
            differing |= diff
            differing_tries += bool(diff)
        async with session.get(worlds[0] + "/metrics", headers=auth(VICTIM)) as r:
            metrics_status = r.status
    return {
        "a_elsewhere": "another image" if decoy else "nothing", "tries": tries, "median_ms_a_sent": statistics.median(ms[True]), "median_ms_a_not": statistics.median(ms[False]),
        "a_sent_faster": sum(a < b for a, b in zip(ms[True], ms[False], strict=True)),
        "statuses": sorted(statuses), "tries_with_a_difference": differing_tries, "differences": sorted(differing),
        "metrics_status_for_tenant": metrics_status,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=8.0, help="length of each phase")
    p.add_argument("--tries", type=int, default=20, help="tries of the side channel")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "attacks.json")
    p.add_argument("--src", type=Path, default=ROOT, help="source tree the gateway and the sim run (its src/)")
    p.add_argument("--phases", default=",".join(ATTACKS[1:]), help="attacks to run, comma-separated")
    p.add_argument("--no-side-channel", action="store_true", help="skip the side-channel tries")
    args = parse_args(p, QUICK)
    attacks = ("unloaded", *(a for a in ATTACKS[1:] if a in args.phases.split(",")))
    # The gateway and the sim import the tree asked for; this script keeps its own (tests.support).
    env = {**os.environ, "PYTHONPATH": f"{args.src.resolve() / 'src'}{os.pathsep}{args.src.resolve()}"}
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmp:
        keys, admin = Path(tmp) / "keys.txt", Path(tmp) / "admin.key"
        keys.write_text(f"{VICTIM} victim\n{ATTACKER} attacker\n")
        admin.write_text(ADMIN + "\n")
        urls, pids, ports, sim_urls = [], [], [], []
        try:
            idle_port = free_port()
            procs.append(start([IDLE_SERVER, str(idle_port)], idle_port, command=[sys.executable, "-c"], env=env))
            for _ in range(2):  # the attacks run against the first; the side channel compares both
                sim_port, port = free_port(), free_port()
                procs.append(start(["sim", "--port", str(sim_port), "--speedup", "20", "--max-model-len", "100000",
                                    "--mm-processor-cache-gb", "0.02"], sim_port, env=env))
                procs.append(start(["serve", "--port", str(port), "--backend", f"vllm=http://127.0.0.1:{sim_port}",
                                    "--api-keys-file", str(keys), "--admin-key-file", str(admin),
                                    "--tenant-secret", "attacks-benchmark-secret", "--log-level", "warning",
                                    "--max-inflation-ratio", "20", "--stream-stall-timeout", "5",
                                    "--uuid-store-bytes", str(16 * MiB),
                                    # the sim's processor cache, as an operator tells the gateway vLLM's
                                    "--reuse-backend-cache-gb", "0.02"], port, env=env))
                urls.append(f"http://127.0.0.1:{port}")
                sim_urls.append(f"http://127.0.0.1:{sim_port}")
                pids.append(procs[-1].pid)
                ports.append(port)
            rows = asyncio.run(run_phases(urls[0], ports[0], pids[0], procs[1].pid, sim_urls[0],
                                          f"http://127.0.0.1:{idle_port}", args.seconds, attacks))
            sides = [] if args.no_side_channel else [
                asyncio.run(side_channel(urls, args.tries, decoy=decoy)) for decoy in (True, False)]
        finally:
            for proc in reversed(procs):
                stop(proc)
    print(render([Column("attack", 19, lambda r: r["attack"], left=True),
                  Column("victim n", 9, lambda r: str(r["n"])), Column("errors", 7, lambda r: str(r["errors"])),
                  Column("p50 ms", 9, lambda r: f"{r['p50_ms']:.1f}"), Column("p99 ms", 9, lambda r: f"{r['p99_ms']:.1f}"),
                  Column("p99/unloaded", 13, lambda r: f"{r['p99_vs_unloaded']:.2f}x"),
                  Column("direct p99", 11, lambda r: f"{r['direct_p99_ms']:.1f}"),
                  Column("direct/unl", 11, lambda r: f"{r['direct_p99_vs_unloaded']:.2f}x"),
                  Column("/health p99", 12, lambda r: f"{r['health_p99_ms']:.1f}"),
                  Column("idle proc p99", 14, lambda r: f"{r['idle_health_p99_ms']:.1f}"),
                  Column("RSS MiB", 9, lambda r: f"{r['rss_start_mib']:.0f}"),
                  Column("RSS growth MiB", 15, lambda r: f"{r['rss_growth_mib']:.1f}"),
                  Column("gateway CPU s", 14, lambda r: f"{r['gateway_cpu_s']:.1f}"),
                  Column("sim CPU s", 10, lambda r: f"{r['sim_cpu_s']:.1f}"),
                  Column("attack req/s", 13, lambda r: f"{r['attacker_answers_per_s']:.0f}")], rows))
    print()
    for side in sides:
        print(f"side channel, {side['tries']} tries, A sends {side['a_elsewhere']} in the other world: B's median "
              f"{side['median_ms_a_sent']:.1f} ms where A sent the image, {side['median_ms_a_not']:.1f} ms where not "
              f"(faster where sent in {side['a_sent_faster']}/{side['tries']}); statuses {side['statuses']}; tries whose "
              f"answers differ: {side['tries_with_a_difference']} ({', '.join(side['differences']) or 'nothing'}); "
              f"/metrics with B's key: {side['metrics_status_for_tenant']}")
    write_results(args.out, {"seconds": args.seconds, "src": str(args.src), "phases": rows, "side_channel": sides})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
