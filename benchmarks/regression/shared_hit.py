"""A shared-tier hit against a raw redis-py ``GET`` of the same entry, interleaved, in one run.

Starts its own redis-server on loopback (persistence off), stores one image entry through
``RedisSharedTier.put``, then times, call by call in a shuffled order each round: redis-py's own
``GET`` of the stored value (the floor: what the wire and the client cost), ``RedisSharedTier.get``
of it (the same GET plus the entry's checks and unpacking), and ``RedisSharedTier.get`` of the
same image stored as a version-1 entry (CRC-32, the checksum entries had before XXH3), each with
redis-py's pure-Python reply parser and with hiredis's (when installed). Prints p50 per path and
the tier's ratio to the raw GET with the same parser; writes JSON.

    .venv/bin/python benchmarks/regression/shared_hit.py --iterations 3000
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import random
import statistics
import struct
import tempfile
import time
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from redis._parsers import _AsyncHiredisParser, _AsyncRESP2Parser
from redis.asyncio import BlockingConnectionPool, Redis
from redis.utils import HIREDIS_AVAILABLE
from tests.support.redis_servers import RedisServer

from benchmarks._procs import ROOT
from benchmarks._run import parse_args, write_results
from benchmarks._table import Column, render
from mmgate.config import CacheSettings, MediaSettings
from mmgate.store.redis.nodes import StandaloneNodes
from mmgate.store.redis.tier import RedisSharedTier, SharedCacheMetrics
from mmgate.store.types import LoadedImage

MiB = 1 << 20
QUICK = {"iterations": 20, "size": 64 * 1024}


def tier_for(port: int, parser: type, cache: CacheSettings, media: MediaSettings) -> tuple[RedisSharedTier, Redis]:
    """A tier whose one node client uses ``parser``, and a plain client with the same parser."""
    def client() -> Redis:
        return Redis.from_pool(BlockingConnectionPool(host="127.0.0.1", port=port, parser_class=parser))
    tier = RedisSharedTier(StandaloneNodes(client()), cache, media, SharedCacheMetrics(CollectorRegistry()))
    return tier, client()


def version1_entry(image: LoadedImage) -> bytes:
    """The entry as gateways before XXH3 wrote it: a CRC-32 (u32) over the same bytes."""
    mime, digest = image.mime.encode(), image.digest.encode()
    fixed = struct.pack(">4sBBBxIIQ", b"MMGI", 1, len(mime), len(digest), image.width, image.height,
                        len(image.data))
    crc = zlib.crc32(image.data, zlib.crc32(digest, zlib.crc32(mime, zlib.crc32(fixed))))
    return fixed + struct.pack(">I", crc) + mime + digest + image.data


async def run(port: int, size: int, iterations: int) -> dict[str, list[float]]:
    cache = CacheSettings(redis_url=f"redis://127.0.0.1:{port}", local_cache_bytes=0)
    media = MediaSettings(max_image_bytes=4 * size)
    parsers: dict[str, type] = {"python": _AsyncRESP2Parser}
    if HIREDIS_AVAILABLE:
        parsers["hiredis"] = _AsyncHiredisParser
    image = LoadedImage(data=os.urandom(size), mime="image/jpeg", width=1024, height=768, digest="ab" * 32)
    calls: dict[str, Callable[[], Awaitable[Any]]] = {}
    closers = []
    for name, parser in parsers.items():
        tier, raw = tier_for(port, parser, cache, media)
        closers += [tier.close, raw.aclose]
        await tier.put("bench-image", image)
        value_key = tier.storage_keys("bench-image")[0]
        got = await tier.get("bench-image")
        if got is None or got.data != image.data:
            raise RuntimeError(f"{name}: the tier did not return the stored image")
        await raw.set(tier.storage_keys("bench-v1")[0], version1_entry(image))
        old = await tier.get("bench-v1")
        if old is None or old.data != image.data:
            raise RuntimeError(f"{name}: the tier did not read the version-1 entry")
        calls[f"raw GET ({name})"] = functools.partial(raw.get, value_key)
        calls[f"tier.get ({name})"] = functools.partial(tier.get, "bench-image")
        calls[f"tier.get v1 ({name})"] = functools.partial(tier.get, "bench-v1")
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(50):  # warm: connections, pools
        for call in calls.values():
            await call()
    order = list(calls.items())
    shuffle = random.Random(0).shuffle
    for _ in range(iterations):
        shuffle(order)  # no path always first (or after the same one) in its round
        for name, call in order:
            t0 = time.perf_counter_ns()
            await call()
            samples[name].append((time.perf_counter_ns() - t0) / 1000)
    for close in closers:
        await close()
    return samples


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=2000)
    p.add_argument("--size", type=int, default=MiB, help="payload bytes of the entry")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "shared_hit.json")
    args = parse_args(p, QUICK)
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    with tempfile.TemporaryDirectory() as workdir:
        server = RedisServer(Path(workdir))
        server.start()
        try:
            samples = asyncio.run(run(server.port, args.size, args.iterations))
        finally:
            server.stop()
    p50 = {name: statistics.median(s) for name, s in samples.items()}
    rows = []
    for name, value in p50.items():
        parser = name.split("(")[1].rstrip(")")
        floor = p50[f"raw GET ({parser})"]
        rows.append({"path": name, "p50": f"{value:.0f}", "ratio": f"{value / floor:.2f}"})
    columns = [Column("path", 24, lambda r: r["path"], left=True), Column("p50 µs", 8, lambda r: r["p50"]),
               Column("÷ raw GET, same parser", 24, lambda r: r["ratio"])]
    print(f"entry payload {args.size} bytes, {args.iterations} interleaved rounds")
    print(render(columns, rows))
    write_results(args.out, {"args": {k: str(v) for k, v in vars(args).items()}, "p50_us": p50})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
