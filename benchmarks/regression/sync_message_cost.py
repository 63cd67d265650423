"""CPU one routing-sync message costs a gateway, and what a flood of the largest ones does to its
event loop, with and without the sync's admission (signature, order, per-sender budget).

Against a throwaway redis-server on loopback:

* ``publish`` / ``receive``: a small message of the sync's format (4 backends' loads, one routed
  request of 3 keys, signed): ``--messages`` PUBLISHes in a row on a pooled and a single-connection
  client, and the same number received from another process one per ``--spacing-ms`` with
  ``PubSub.get_message`` (as ``RoutingSync`` does) and ``PubSub.listen()``. CPU is this process's
  user + system time per message.
* ``apply``: in process, the event-loop time ``RoutingSync.apply`` takes for the largest valid
  message (256 routed requests of 64 keys, into a real ``BackendHoldings``, as the router's):
  signed and admitted; the same body unsigned through the decode and apply alone (what every
  message cost before the admission); forged (wrong secret); replayed.
* ``flood``: another process publishes the largest message ``--flood-rate`` times a second for
  ``--flood-s`` seconds while this one's ``RoutingSync`` listens and a ticker measures its event
  loop's lag (how late a 5 ms sleep wakes: what every request on the gateway waits). Rows:
  ``unbounded`` (a budget too large to bind: the sync before the budget), ``budget`` (the
  default), ``forged`` (the flood without the secret). Interleaved, ``--repeats`` rounds, medians.

    .venv/bin/python benchmarks/regression/sync_message_cost.py
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from benchmarks._procs import free_port, stop
from benchmarks._run import parse_args, write_results
from benchmarks._table import Column, pct, print_table
from benchmarks.regression.image_affinity import start_redis
from mmgate.config import GatewaySettings
from mmgate.fleet import BackendHoldings
from mmgate.metrics import GatewayMetrics
from mmgate.routing import PeerBudget, Routed, RoutingSync, sync_message

CHANNEL = "bench:routing"
SECRET = b"the benchmark's fleet secret, 32+ characters"
SENDER = "0123456789abcdef"
QUICK = {"messages": 20, "apply_messages": 5, "flood_rate": 50.0, "flood_s": 0.4, "repeats": 1}


def unbounded() -> PeerBudget:
    """A budget too large to bind: the sync as it was before the budget."""
    return PeerBudget(cpu_per_s=1e9, burst_s=1e9, total_cpu_per_s=1e9)


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def largest(number: int, secret: bytes = SECRET) -> bytes:
    """The largest valid message: routed requests of 64 keys each (the most a request carries), as
    many as one message may hold (1,024 keys)."""
    routed = [Routed("vllm-0", e, tuple(f"tenant~{e:03d}{k:02d}" for k in range(64))) for e in range(16)]
    return sync_message(secret, SENDER, number, routed)


def receiver(url: str, budget: PeerBudget | None = None) -> tuple[RoutingSync, CollectorRegistry]:
    """A gateway's sync listening on the channel, its record a real ``BackendHoldings``."""
    holdings = BackendHoldings.for_settings(GatewaySettings())
    registry = CollectorRegistry()

    def routed(r: Routed) -> None:  # what the router does with another gateway's routed request
        holdings.hold(r.backend, [(key, 1 << 20) for key in r.keys])
        holdings.show(r.keys, r.token)

    sync = RoutingSync(Redis.from_url(url, socket_timeout=5), CHANNEL, routed,
                       secret=SECRET, io_timeout_s=5.0, clock=time.monotonic, metrics=GatewayMetrics(registry),
                       budget=budget)
    return sync, registry


def received(registry: CollectorRegistry, outcome: str) -> float:
    value = registry.get_sample_value("mmgate_routing_sync_messages_total",
                                      {"direction": "received", "outcome": outcome})
    return value or 0.0


# publish / receive -------------------------------------------------------------------------------

async def publish_cost(client: Redis, data: bytes, count: int) -> float:
    await client.ping()
    start = cpu_s()
    for _ in range(count):
        await client.publish(CHANNEL, data)
    return (cpu_s() - start) / count


def write_messages(path: str, messages: list[bytes]) -> None:
    """``messages`` for ``publisher``, each after its length (4 bytes)."""
    Path(path).write_bytes(b"".join(len(m).to_bytes(4, "big") + m for m in messages))


def publisher(port: int, path: str, count: int, spacing_s: float) -> list[str]:
    """A command that publishes ``count`` messages ``spacing_s`` apart, those of ``path`` in turn."""
    code = (f"import redis, time\nr = redis.Redis(port={port})\nraw, data = open({path!r}, 'rb').read(), []\n"
            "while raw:\n    n = int.from_bytes(raw[:4], 'big'); data.append(raw[4:4 + n]); raw = raw[4 + n:]\n"
            f"start = time.monotonic()\nfor i in range({count}):\n"
            f"    time.sleep(max(0, start + i * {spacing_s} - time.monotonic()))\n"
            f"    r.publish({CHANNEL!r}, data[i % len(data)])\n")
    return [sys.executable, "-c", code]


async def receive_cost(url: str, port: int, path: str, count: int, spacing_ms: float, how: str) -> float:
    client = Redis.from_url(url, socket_timeout=5)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(CHANNEL)
    got = 0
    start = cpu_s()
    proc = await asyncio.create_subprocess_exec(*publisher(port, path, count, spacing_ms / 1000))
    try:
        async with asyncio.timeout(60 + count * spacing_ms / 100):
            if how == "listen":
                async for message in pubsub.listen():
                    got += message.get("type") == "message"
                    if got >= count:
                        break
            else:
                while got < count:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    got += message is not None
        return (cpu_s() - start) / count
    finally:
        await asyncio.wait_for(proc.wait(), 30)
        await pubsub.aclose()
        await client.aclose()


# apply -------------------------------------------------------------------------------------------

def apply_cost(url: str, count: int) -> dict[str, float]:
    """Event-loop time (µs) of one ``apply`` of the largest message, by what it is."""
    sync, _ = receiver(url, unbounded())
    messages = [largest(n) for n in range(count)]
    forged = [largest(n, b"a guessed secret, 32+ characters long") for n in range(count)]
    out: dict[str, float] = {"largest_message_bytes": float(len(messages[0]))}
    for what, batch, applied in (("signed", messages, True), ("replayed", messages, False),
                                 ("forged", forged, False)):
        start = time.perf_counter()
        for data in batch:
            assert sync.apply(data) is applied
        out[f"apply_{what}_us"] = 1e6 * (time.perf_counter() - start) / count
    return out


# flood -------------------------------------------------------------------------------------------

async def flood(url: str, port: int, path: str, args: argparse.Namespace,
                budget: PeerBudget | None) -> dict[str, float]:
    """The event loop's lag and this process's CPU while another process floods the channel."""
    sync, registry = receiver(url, budget)
    task = asyncio.create_task(sync.run())
    lags: list[float] = []
    try:
        async with asyncio.timeout(10):
            await sync.subscribed.wait()
        count = round(args.flood_rate * args.flood_s)
        proc = await asyncio.create_subprocess_exec(*publisher(port, path, count, 1 / args.flood_rate))
        start_cpu, started = cpu_s(), time.perf_counter()
        waiting = asyncio.create_task(proc.wait())
        while not waiting.done():
            before = time.perf_counter()
            await asyncio.sleep(0.005)
            lags.append(1e3 * (time.perf_counter() - before - 0.005))
        await asyncio.sleep(0.5)  # the last ones arrive
        cpu, wall = cpu_s() - start_cpu, time.perf_counter() - started
        return {"lag_p50_ms": pct(lags, 50), "lag_p99_ms": pct(lags, 99), "lag_max_ms": max(lags),
                "cpu_share": cpu / wall, "sent": float(count), "applied": received(registry, "ok"),
                "dropped": sum(received(registry, o) for o in ("over_budget", "forged", "replayed")),
                "cpu_s_applying": sync.budget.spent_s}
    finally:
        task.cancel()
        await asyncio.wait([task])
        await sync.close()


async def one_round(url: str, port: int, args: argparse.Namespace, paths: dict[str, str],
                    small: bytes) -> dict[str, Any]:
    pooled = Redis.from_url(url, socket_timeout=5)
    single = Redis.from_url(url, socket_timeout=5, single_connection_client=True)
    try:
        costs = {
            "publish_pooled_us": 1e6 * await publish_cost(pooled, small, args.messages),
            "publish_single_us": 1e6 * await publish_cost(single, small, args.messages),
            "receive_get_message_us": 1e6 * await receive_cost(url, port, paths["small"], args.messages,
                                                               args.spacing_ms, "get"),
            "receive_listen_us": 1e6 * await receive_cost(url, port, paths["small"], args.messages,
                                                          args.spacing_ms, "listen"),
            **apply_cost(url, args.apply_messages),
        }
    finally:
        await pooled.aclose()
        await single.aclose()
    floods = {
        "unbounded": await flood(url, port, paths["largest"], args, unbounded()),
        "budget": await flood(url, port, paths["largest"], args, None),
        "forged": await flood(url, port, paths["forged"], args, None),
    }
    return {"costs": costs, "floods": floods}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--spacing-ms", type=float, default=1.0)
    parser.add_argument("--apply-messages", type=int, default=50)
    parser.add_argument("--flood-rate", type=float, default=400.0, help="largest messages a second")
    parser.add_argument("--flood-s", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="results/sync_message_cost.json")
    args = parse_args(parser, QUICK)
    port = free_port()
    redis = start_redis(port)
    with tempfile.TemporaryDirectory() as tmp:
        paths = {"small": f"{tmp}/small", "largest": f"{tmp}/largest", "forged": f"{tmp}/forged"}
        small = sync_message(SECRET, SENDER, 0, [Routed("vllm-1", 1234567, tuple(f"tenant~{'k' * 40}{i}" for i in range(3)))])
        write_messages(paths["small"], [small])
        # A key holder's flood: each message numbered (a copy of one would be a replay, dropped unread).
        write_messages(paths["largest"], [largest(n) for n in range(round(args.flood_rate * args.flood_s))])
        write_messages(paths["forged"], [largest(0, b"a guessed secret, 32+ characters long")])
        try:
            runs = [asyncio.run(one_round(f"redis://127.0.0.1:{port}", port, args, paths, small))
                    for _ in range(args.repeats)]
        finally:
            stop(redis)
    cost_rows: list[dict[str, Any]] = [
        {"what": key, "median": statistics.median(r["costs"][key] for r in runs),
         "runs": [round(r["costs"][key]) for r in runs]} for key in runs[0]["costs"]]
    print(f"CPU per message (publish/receive: {args.messages} small messages, {args.spacing_ms:g} ms apart; "
          f"apply: event-loop time, the largest message); medians of {args.repeats}")
    print_table([Column("what", 26, lambda r: r["what"], left=True),
                 Column("median", 9, lambda r: f"{r['median']:.0f}"),
                 Column("  runs", 24, lambda r: "  " + " ".join(map(str, r["runs"])), left=True)], cost_rows)
    flood_rows: list[dict[str, Any]] = []
    for name in runs[0]["floods"]:
        row: dict[str, Any] = {"what": name}
        for key in runs[0]["floods"][name]:
            row[key] = statistics.median(r["floods"][name][key] for r in runs)
        flood_rows.append(row)
    print(f"\nflood: the largest message {args.flood_rate:g}/s for {args.flood_s:g} s; medians of {args.repeats}")
    print_table([Column("what", 11, lambda r: r["what"], left=True),
                 Column("lag p50 ms", 11, lambda r: f"{r['lag_p50_ms']:.2f}"),
                 Column("lag p99 ms", 11, lambda r: f"{r['lag_p99_ms']:.1f}"),
                 Column("lag max ms", 11, lambda r: f"{r['lag_max_ms']:.1f}"),
                 Column("CPU", 7, lambda r: f"{r['cpu_share']:.0%}"),
                 Column("sent", 6, lambda r: f"{r['sent']:.0f}"),
                 Column("applied", 8, lambda r: f"{r['applied']:.0f}"),
                 Column("dropped", 8, lambda r: f"{r['dropped']:.0f}"),
                 Column("CPU s applying", 15, lambda r: f"{r['cpu_s_applying']:.3f}")], flood_rows)
    write_results(args.out, {"args": vars(args), "command": " ".join(sys.argv), "costs": cost_rows,
                             "floods": flood_rows, "runs": runs,
                             "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


if __name__ == "__main__":
    main()
