"""CPU one routing-sync message costs a gateway: publishing it and receiving it (redis-py asyncio).

Against a throwaway redis-server on loopback, with a message of the sync's format
(``mmgate.routing.encode_sync_message``: 4 backends' loads and one routed request of 3 keys):

* publish: ``--messages`` PUBLISHes in a row, on a pooled client (as ``RoutingSync`` does) and on a
  single-connection one;
* receive: another process publishes the same number, one per ``--spacing-ms`` (each arrives on its
  own, as the sync's do), while this one reads them with ``PubSub.get_message`` (as ``RoutingSync``
  does) and with ``PubSub.listen()``.

CPU is this process's user + system time per message. ``--repeats`` runs everything again and
prints medians.

    .venv/bin/python benchmarks/sync_message_cost.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _procs import free_port, stop
from _table import Column, print_table
from image_affinity import start_redis
from mmgate.routing import Routed, encode_sync_message

CHANNEL = "bench:routing"


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def publish_cost(client: Redis, data: bytes, count: int) -> float:
    await client.ping()
    start = cpu_s()
    for _ in range(count):
        await client.publish(CHANNEL, data)
    return (cpu_s() - start) / count


async def receive_cost(url: str, port: int, data: bytes, count: int, spacing_ms: float, how: str) -> float:
    client = Redis.from_url(url, socket_timeout=5)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(CHANNEL)
    code = (f"import redis, time\nr = redis.Redis(port={port})\n"
            f"for _ in range({count}):\n    r.publish({CHANNEL!r}, {data!r}); time.sleep({spacing_ms / 1000})\n")
    got = 0
    start = cpu_s()
    publisher = await asyncio.create_subprocess_exec(sys.executable, "-c", code)
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
        await asyncio.wait_for(publisher.wait(), 30)
        await pubsub.aclose()
        await client.aclose()


async def one_round(url: str, port: int, args: argparse.Namespace) -> dict[str, float]:
    data = encode_sync_message("0123456789abcdef", {f"vllm-{i}": i for i in range(4)},
                                 [Routed("vllm-1", 1234567, tuple(f"tenant~{'k' * 40}{i}" for i in range(3)))])
    pooled = Redis.from_url(url, socket_timeout=5)
    single = Redis.from_url(url, socket_timeout=5, single_connection_client=True)
    try:
        return {
            "publish_pooled_us": 1e6 * await publish_cost(pooled, data, args.messages),
            "publish_single_us": 1e6 * await publish_cost(single, data, args.messages),
            "receive_get_message_us": 1e6 * await receive_cost(url, port, data, args.messages, args.spacing_ms, "get"),
            "receive_listen_us": 1e6 * await receive_cost(url, port, data, args.messages, args.spacing_ms, "listen"),
            "message_bytes": float(len(data)),
        }
    finally:
        await pooled.aclose()
        await single.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--spacing-ms", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="results/sync_message_cost.json")
    args = parser.parse_args()
    port = free_port()
    redis = start_redis(port)
    try:
        runs = [asyncio.run(one_round(f"redis://127.0.0.1:{port}", port, args)) for _ in range(args.repeats)]
    finally:
        stop(redis)
    rows: list[dict[str, Any]] = [{"what": key, "median": statistics.median(r[key] for r in runs),
                                   "runs": [round(r[key]) for r in runs]} for key in runs[0]]
    print(f"{args.messages} messages, received {args.spacing_ms:g} ms apart; CPU per message, medians of {args.repeats}")
    print_table([Column("what", 24, lambda r: r["what"], left=True),
                 Column("median", 9, lambda r: f"{r['median']:.0f}"),
                 Column("  runs", 24, lambda r: "  " + " ".join(map(str, r["runs"])), left=True)], rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "command": " ".join(sys.argv), "rows": rows,
                               "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
