"""MediaLoader + the real shared tier: loaders (and OS processes) sharing one Redis fetch an image
from the origin once; a Redis that dies mid-load never fails a load."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from mmgate.config import CacheSettings, MediaSettings
from mmgate.media.keys import url_key
from mmgate.store.redis.tier import RedisSharedTier, build_shared_tier
from tests.media.conftest import LoaderFactory
from tests.support.images import make_image
from tests.support.origin import ImageOrigin
from tests.support.redis_servers import (
    RedisTarget,
    running_standalone,
)


@pytest.fixture(scope="module")
def target(redis_target: RedisTarget) -> RedisTarget:
    """Standalone and cluster (tests/conftest.py)."""
    return redis_target


MEDIA = {"allowed_private": ("127.0.0.1",), "total_timeout_s": 5.0}


def shared_tier(url: str, *, cluster: bool = False) -> RedisSharedTier:
    tier = build_shared_tier(
        # fill_wait_s: past any origin delay here, so dedup never depends on the machine's speed.
        CacheSettings(redis_url=url, redis_cluster=cluster, redis_connect_timeout_s=0.5,
                      redis_io_timeout_s=0.5, fill_wait_s=5.0),
        MediaSettings(**MEDIA),  # type: ignore[arg-type]
        CollectorRegistry(),
    )
    assert isinstance(tier, RedisSharedTier)
    return tier


def outcomes(registry: CollectorRegistry) -> dict[str, float]:
    return {
        outcome: registry.get_sample_value("mmgate_image_loads_total", {"outcome": outcome}) or 0.0
        for outcome in ("local_hit", "shared_hit", "inflight_join", "origin", "error")
    }


async def test_second_loader_gets_a_shared_hit(
    target: RedisTarget, origin: ImageOrigin, make_loader: LoaderFactory
) -> None:
    name = f"{uuid.uuid4().hex}.png"
    url = origin.add(name, make_image("PNG", 120, 80))
    tiers = [shared_tier(target.url, cluster=target.cluster) for _ in range(2)]
    registries = [CollectorRegistry(), CollectorRegistry()]
    try:
        first, second = (make_loader(media=MEDIA, shared=t, registry=r) for t, r in zip(tiers, registries, strict=True))
        a = await first.load(url)
        b = await second.load(url)
    finally:
        for tier in tiers:
            await tier.close()
    assert origin.hits[f"/img/{name}"] == 1
    assert (a.digest, a.width, a.height) == (b.digest, 120, 80)
    assert outcomes(registries[0])["origin"] == 1
    assert outcomes(registries[1])["shared_hit"] == 1


async def test_two_loaders_loading_at_once_fetch_once(
    target: RedisTarget, origin: ImageOrigin, make_loader: LoaderFactory
) -> None:
    name = f"{uuid.uuid4().hex}.png"
    origin.add(name, make_image("PNG", 64, 64))
    url = origin.url(f"/slow-headers/{name}?delay=0.3")  # long enough for the other to wait
    tiers = [shared_tier(target.url, cluster=target.cluster) for _ in range(2)]
    try:
        loaders = [make_loader(media=MEDIA, shared=t) for t in tiers]
        images = await asyncio.gather(*(loaders[i % 2].load(url) for i in range(20)))
    finally:
        for tier in tiers:
            await tier.close()
    assert origin.hits[f"/slow-headers/{name}"] == 1
    assert len({img.digest for img in images}) == 1


_PROCESS_SCRIPT = r"""
import asyncio, collections, json, sys
from prometheus_client import CollectorRegistry
from mmgate.config import CacheSettings, MediaSettings
from mmgate.media.loader import MediaLoader
from mmgate.store.redis.tier import build_shared_tier

async def main(redis_url, cluster, url, concurrency):
    media = MediaSettings(allowed_private=("127.0.0.1",), total_timeout_s=5.0)
    # A fill wait well past the origin's 0.3 s: on two busy cores the default 1 s can run out
    # before the holder's fetch ends, and this test is about dedup, not about the bound.
    cache = CacheSettings(redis_url=redis_url, redis_cluster=cluster == "1", fill_wait_s=5.0)
    registry = CollectorRegistry()
    shared = build_shared_tier(cache, media, registry)
    loader = MediaLoader(media, cache, registry=registry, shared=shared)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # "go"
    images = await asyncio.gather(*(loader.load(url) for _ in range(concurrency)))
    counts = {o: registry.get_sample_value("mmgate_image_loads_total", {"outcome": o}) or 0
              for o in ("shared_hit", "inflight_join", "origin", "error", "local_hit")}
    print(json.dumps({"digests": sorted({i.digest for i in images}), "loads": len(images),
                      "outcomes": counts}), flush=True)
    await loader.close()
    await shared.close()

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
"""


async def test_four_processes_times_25_loads_fetch_once(
    target: RedisTarget, origin: ImageOrigin
) -> None:
    name = f"{uuid.uuid4().hex}.png"
    origin.add(name, make_image("PNG", 256, 256))
    url = origin.url(f"/slow-headers/{name}?delay=0.3")
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", _PROCESS_SCRIPT, target.url, "1" if target.cluster else "0", url, "25",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )
        for _ in range(4)
    ]
    try:
        for proc in procs:  # all four are up and connected before any load starts
            assert proc.stdout is not None
            assert (await asyncio.wait_for(proc.stdout.readline(), 30)).strip() == b"ready"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()
        reports = []
        for proc in procs:
            out, _ = await asyncio.wait_for(proc.communicate(), 30)
            assert proc.returncode == 0
            reports.append(json.loads(out.decode().strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert origin.hits[f"/slow-headers/{name}"] == 1
    assert all(r["loads"] == 25 for r in reports)
    assert len({d for r in reports for d in r["digests"]}) == 1
    total: Counter[str] = Counter()
    for r in reports:
        total.update(r["outcomes"])
    assert total["origin"] == 1 and total["shared_hit"] == 3 and total["error"] == 0
    assert total["inflight_join"] == 4 * 24


async def test_redis_stopped_mid_load_every_load_succeeds(
    tmp_path: Path, origin: ImageOrigin, make_loader: LoaderFactory
) -> None:
    with running_standalone(tmp_path) as server:
        tier = shared_tier(server.url)
        other_process = shared_tier(server.url)
        registry = CollectorRegistry()
        try:
            loader = make_loader(media=MEDIA, shared=tier, registry=registry)
            names = [f"{uuid.uuid4().hex}.png" for _ in range(8)]
            for name in names:
                origin.add(name, make_image("PNG", 32, 32))
            # Another process holds the lease of the first image: our loader waits on it.
            waited_url = origin.url(f"/img/{names[0]}")
            assert await other_process.acquire_fill_lease(url_key(waited_url)) is True
            loads = [asyncio.create_task(loader.load(waited_url))]
            loads += [
                asyncio.create_task(loader.load(origin.url(f"/slow-headers/{n}?delay=0.3")))
                for n in names[1:]
            ]
            await asyncio.sleep(0.15)
            assert not any(t.done() for t in loads)
            server.stop()  # mid-load: the waiter's poll, the fills' puts all hit a dead Redis
            images = await asyncio.wait_for(asyncio.gather(*loads), 10)
            # Redis still down: a repeat is a local hit, a new image comes from the origin.
            again = await loader.load(origin.url(f"/slow-headers/{names[1]}?delay=0.3"))
            fresh = await loader.load(origin.url(f"/img/{names[2]}"))
        finally:
            await tier.close()
            await other_process.close()
    assert len(images) == 8 and all(img.width == 32 for img in images)
    assert again.digest == images[1].digest and fresh.digest == images[2].digest
    assert origin.hits[f"/img/{names[0]}"] == 1  # the waiter fell back to the origin itself
    counts = outcomes(registry)
    assert counts == {"local_hit": 1, "shared_hit": 0, "inflight_join": 0, "origin": 9, "error": 0}
