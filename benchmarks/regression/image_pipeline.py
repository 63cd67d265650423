"""Image pipeline: what each tier of the media loader costs, and how many origin requests a burst
of loads of one image makes.

Starts its own redis-server processes on loopback (one standalone, one 3-master cluster), a
loopback HTTP image origin that counts requests, and measures through ``MediaLoader``:

* local hit        — a repeat load served by the local LRU;
* shared hit       — a load with no local cache, served by Redis (1 MiB entry: GET + CRC check),
                     standalone and cluster; also the tier's own ``get`` (no loader around it);
* origin miss      — no caches: HTTP fetch from the loopback origin, validation, SHA-256;
* fill dedup       — origin requests for 100 concurrent loads of one new URL, in one process and
                     split over 4 OS processes (25 each) sharing Redis (fill lease);
* first load       — a fresh process's first load (origin, full decode) once its loader is ready,
                     with the decode processes started as the gateway starts them
                     (``MediaLoader.start``) and left to start on demand, rounds alternating.

    .venv/bin/python benchmarks/regression/image_pipeline.py --out results/image_pipeline.json
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import io
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from PIL import Image
from prometheus_client import CollectorRegistry
from tests.support.redis_servers import RedisClusterServers, RedisServer

from benchmarks._run import parse_args, write_results
from mmgate.app_runtime import install_uvloop, start_app
from mmgate.config import CacheSettings, MediaSettings
from mmgate.media.keys import url_key
from mmgate.media.loader import MediaLoader
from mmgate.store.redis.tier import RedisSharedTier, build_shared_tier

MiB = 1024 * 1024
AIMS = {"local_hit_p50_us": 50.0, "shared_hit_1mib_p50_us": 2000.0, "origin_requests_per_burst": 1}
QUICK = {"iterations": 20, "miss_iterations": 5, "image_bytes": 64 * 1024, "no_cluster": True, "first_rounds": 1}


class Origin:
    """Loopback image origin: ``/img/{name}?delay_ms=N``; counts requests per name."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.hits: Counter[str] = Counter()
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> Origin:
        app = web.Application()
        app.router.add_get("/img/{name}", self._img)
        self._runner, self.port = await start_app(app, "127.0.0.1", 0)
        return self

    def url(self, name: str, delay_ms: int = 0) -> str:
        return f"http://127.0.0.1:{self.port}/img/{name}?delay_ms={delay_ms}"

    async def _img(self, request: web.Request) -> web.Response:
        self.hits[request.match_info["name"]] += 1
        delay_ms = int(request.query.get("delay_ms", "0"))
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        return web.Response(body=self.data, content_type="image/jpeg")

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def noisy_jpeg(target_bytes: int) -> bytes:
    """A real JPEG of about ``target_bytes`` (random pixels do not compress)."""
    side = int((target_bytes / 1.2) ** 0.5)
    for _ in range(8):
        img = Image.frombytes("RGB", (side, side), os.urandom(side * side * 3))
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=90)
        if abs(buf.tell() - target_bytes) <= target_bytes * 0.05:
            break
        side = max(16, int(side * (target_bytes / buf.tell()) ** 0.5))
    return buf.getvalue()


MEDIA = MediaSettings(allowed_private=("127.0.0.1",), total_timeout_s=10.0)


def cache_settings(redis_url: str | None = None, *, cluster: bool = False, local_bytes: int = 512 * MiB) -> CacheSettings:
    return CacheSettings(redis_url=redis_url, redis_cluster=cluster, local_cache_bytes=local_bytes,
                         key_prefix=f"bench{uuid.uuid4().hex[:8]}:")


def shared_for(cache: CacheSettings) -> RedisSharedTier:
    tier = build_shared_tier(cache, MEDIA, CollectorRegistry())
    assert isinstance(tier, RedisSharedTier)
    return tier


async def timed(n: int, call: Callable[[], Awaitable[object]]) -> dict[str, float]:
    for _ in range(min(50, n)):  # warm connections, pools and caches
        await call()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        await call()
        samples.append((time.perf_counter_ns() - t0) / 1000)
    samples.sort()
    return {"n": n, "p50_us": samples[n // 2], "p99_us": samples[min(n - 1, int(n * 0.99))]}


async def latency_rows(origin: Origin, urls: dict[str, str], args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    image_url = origin.url("latency")

    loader = MediaLoader(MEDIA, cache_settings())
    rows.append({"name": "local hit (MediaLoader)", **await timed(args.iterations, lambda: loader.load(image_url))})
    await loader.close()

    for kind, url in urls.items():
        cache = cache_settings(url, cluster=kind == "cluster", local_bytes=0)
        tier = shared_for(cache)
        loader = MediaLoader(MEDIA, cache, shared=tier)
        await loader.load(image_url)  # fills Redis; no local cache, so every later load asks Redis
        rows.append({"name": f"shared hit 1 MiB, {kind} (MediaLoader)",
                     **await timed(args.iterations, functools.partial(loader.load, image_url))})
        key = url_key(image_url)  # the loader's key for it
        rows.append({"name": f"shared hit 1 MiB, {kind} (tier.get only)",
                     **await timed(args.iterations, functools.partial(tier.get, key))})
        value_key = tier.storage_keys(key)[0]
        route = tier.nodes.route(value_key)
        assert route is not None
        client = route[1]  # the floor: redis-py's own GET of the same entry, on its node
        rows.append({"name": f"redis-py GET 1 MiB, {kind} (floor)",
                     **await timed(args.iterations, functools.partial(client.get, value_key))})
        await loader.close()
        await tier.close()

    loader = MediaLoader(MEDIA, cache_settings(local_bytes=0))
    rows.append({"name": "origin miss 1 MiB, loopback (MediaLoader)",
                 **await timed(args.miss_iterations, lambda: loader.load(image_url))})
    await loader.close()
    return rows


async def burst_one_process(origin: Origin, redis_url: str | None, cluster: bool, loads: int) -> int:
    cache = cache_settings(redis_url, cluster=cluster)
    tier = shared_for(cache) if redis_url else None
    loader = MediaLoader(MEDIA, cache, shared=tier)
    name = uuid.uuid4().hex
    images = await asyncio.gather(*(loader.load(origin.url(name, delay_ms=50)) for _ in range(loads)))
    assert len({img.digest for img in images}) == 1
    await loader.close()
    if tier is not None:
        await tier.close()
    return origin.hits[name]


_WORKER = r"""
import asyncio, json, sys, uuid
from mmgate.config import CacheSettings, MediaSettings
from mmgate.media.loader import MediaLoader
from mmgate.store.redis.tier import build_shared_tier
from prometheus_client import CollectorRegistry


async def main(redis_url, cluster, prefix, url, loads):
    media = MediaSettings(allowed_private=("127.0.0.1",), total_timeout_s=10.0)
    cache = CacheSettings(redis_url=redis_url, redis_cluster=cluster == "1", key_prefix=prefix)
    shared = build_shared_tier(cache, media, CollectorRegistry())
    loader = MediaLoader(media, cache, shared=shared)
    await loader.start()  # as the gateway does before it accepts requests
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    images = await asyncio.gather(*(loader.load(url) for _ in range(loads)))
    print(json.dumps({"loads": len(images), "digests": len({i.digest for i in images})}), flush=True)
    await loader.close()
    await shared.close()

asyncio.run(main(*sys.argv[1:5], int(sys.argv[5])))
"""


async def burst_processes(origin: Origin, redis_url: str, cluster: bool, processes: int, loads: int) -> int:
    name = uuid.uuid4().hex
    url = origin.url(name, delay_ms=50)
    prefix = f"bench{uuid.uuid4().hex[:8]}:"
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", _WORKER, redis_url, "1" if cluster else "0", prefix, url,
            str(loads // processes), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        for _ in range(processes)
    ]
    for proc in procs:
        assert proc.stdout is not None and proc.stdin is not None
        if (await asyncio.wait_for(proc.stdout.readline(), 60)).strip() != b"ready":
            raise RuntimeError("worker did not start")
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
    for proc in procs:
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        report = json.loads(out.decode().strip().splitlines()[-1])
        if proc.returncode != 0 or report["digests"] != 1:
            raise RuntimeError(f"worker failed: {report}")
    return origin.hits[name]


_FIRST = r"""
import asyncio, json, sys, time
from mmgate.config import CacheSettings, MediaSettings
from mmgate.media.loader import MediaLoader


async def main(first_url, second_url, start):
    began = time.perf_counter()
    loader = MediaLoader(MediaSettings(allowed_private=("127.0.0.1",), total_timeout_s=30.0), CacheSettings())
    if start:
        await loader.start()
    ready = time.perf_counter()
    await loader.load(first_url)  # the first request, as soon as the loader is ready
    first = time.perf_counter()
    await loader.load(second_url)  # another new image: what every later one costs
    ms = [(b - a) * 1000 for a, b in ((began, ready), (ready, first), (first, time.perf_counter()))]
    print(json.dumps(dict(zip(("ready_ms", "first_ms", "second_ms"), ms))), flush=True)
    await loader.close()

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] == "1"))
"""


async def first_loads(origin: Origin, rounds: int) -> list[dict[str, Any]]:
    """A fresh process's first load, decode processes started first or on demand (rounds alternate)."""
    samples: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for _ in range(rounds):
        for start in (True, False):
            new_urls = (origin.url(uuid.uuid4().hex), origin.url(uuid.uuid4().hex))
            proc = await asyncio.create_subprocess_exec(sys.executable, "-c", _FIRST, *new_urls,
                                                        "1" if start else "0", stdout=subprocess.PIPE)
            out, _ = await asyncio.wait_for(proc.communicate(), 120)
            if proc.returncode != 0:
                raise RuntimeError("first-load process failed")
            samples[start].append(json.loads(out.decode().strip().splitlines()[-1]))
    rows = []
    for start, runs in samples.items():
        row: dict[str, Any] = {"name": "decode processes " + ("started first" if start else "on demand"),
                               "rounds": rounds}
        for key in ("ready_ms", "first_ms", "second_ms"):
            values = sorted(r[key] for r in runs)
            row[key] = {"p50": values[len(values) // 2], "max": values[-1]}
        rows.append(row)
    return rows


async def run(args: argparse.Namespace, urls: dict[str, str]) -> dict[str, Any]:
    origin = await Origin(noisy_jpeg(args.image_bytes)).start()
    try:
        rows = await latency_rows(origin, urls, args)
        bursts = [{"name": "100 concurrent loads, 1 process, no shared tier", "processes": 1, "loads": 100,
                   "origin_requests": await burst_one_process(origin, None, False, 100)}]
        for kind, url in urls.items():
            bursts.append({"name": f"100 concurrent loads, 1 process, {kind}", "processes": 1, "loads": 100,
                           "origin_requests": await burst_one_process(origin, url, kind == "cluster", 100)})
            bursts.append({"name": f"100 concurrent loads, 4 processes x 25, {kind}", "processes": 4,
                           "loads": 100,
                           "origin_requests": await burst_processes(origin, url, kind == "cluster", 4, 100)})
        first = await first_loads(origin, args.first_rounds) if args.first_rounds else []
        return {"image_bytes": len(origin.data), "latency": rows, "bursts": bursts, "first_load": first}
    finally:
        await origin.stop()


def redis_version() -> str:
    out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, check=False)
    return out.stdout.strip()


def print_table(result: dict[str, Any]) -> None:
    print(f"\nImage pipeline ({result['image_bytes'] / MiB:.2f} MiB JPEG, loop={result['loop']})")
    print(f"{'path':<50} {'n':>6} {'p50 µs':>9} {'p99 µs':>9}")
    for row in result["latency"]:
        print(f"{row['name']:<50} {row['n']:>6} {row['p50_us']:>9.1f} {row['p99_us']:>9.1f}")
    print(f"\n{'burst of loads of one new URL':<50} {'origin requests':>15}")
    for row in result["bursts"]:
        print(f"{row['name']:<50} {row['origin_requests']:>15}")
    if result["first_load"]:
        print(f"\n{'fresh process, first load (ms, p50 / max)':<42} {'ready':>13} {'first load':>13} {'second':>13}")
        for row in result["first_load"]:
            cells = " ".join(f"{row[k]['p50']:>6.0f} /{row[k]['max']:>5.0f}" for k in ("ready_ms", "first_ms", "second_ms"))
            print(f"{row['name'] + ' x' + str(row['rounds']):<42} {cells}")
    print("\naims:", ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in result["aims_met"].items()))


def check_aims(result: dict[str, Any]) -> dict[str, bool]:
    by_name = {row["name"]: row for row in result["latency"]}
    shared = [r for n, r in by_name.items() if n.startswith("shared hit") and "MediaLoader" in n]
    return {
        "local_hit_p50<=50us": by_name["local hit (MediaLoader)"]["p50_us"] <= AIMS["local_hit_p50_us"],
        "shared_hit_1mib_p50<=2ms": all(r["p50_us"] <= AIMS["shared_hit_1mib_p50_us"] for r in shared),
        "burst->1_origin_request": all(b["origin_requests"] == 1 for b in result["bursts"]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/image_pipeline.json")
    parser.add_argument("--iterations", type=int, default=2000, help="loads timed per hit row")
    parser.add_argument("--miss-iterations", type=int, default=200, help="loads timed for the origin row")
    parser.add_argument("--image-bytes", type=int, default=MiB)
    parser.add_argument("--no-cluster", action="store_true", help="skip the Redis Cluster rows")
    parser.add_argument("--first-rounds", type=int, default=5,
                        help="fresh processes timed per first-load row (0: no first-load rows)")
    parser.add_argument("--no-uvloop", action="store_true", help="asyncio's own loop (the gateway uses uvloop)")
    args = parse_args(parser, QUICK)
    loop = "asyncio" if args.no_uvloop or not install_uvloop() else "uvloop"
    with tempfile.TemporaryDirectory(prefix="mmgate-bench-redis-") as tmp:
        standalone = RedisServer(Path(tmp) / "standalone")
        cluster = RedisClusterServers(Path(tmp) / "cluster")
        try:
            standalone.start()
            urls = {"standalone": standalone.url}
            if not args.no_cluster:
                cluster.start()
                urls["cluster"] = cluster.url
            result = asyncio.run(run(args, urls))
        finally:
            standalone.stop()
            cluster.stop()
    result.update({
        "loop": loop, "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "python": platform.python_version(), "redis": redis_version(), "cpus": os.cpu_count(),
    })
    result["aims_met"] = check_aims(result)
    print_table(result)
    write_results(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
