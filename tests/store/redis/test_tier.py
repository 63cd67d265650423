"""RedisSharedTier against real redis-server processes: standalone and a 3-master cluster."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from mmgate.config import CacheSettings, MediaSettings
from mmgate.store.redis.format import HEADER_SIZE
from mmgate.store.redis.tier import RedisSharedTier, build_shared_tier
from mmgate.store.types import LoadedImage
from tests.support.redis_servers import (
    RedisTarget,
    running_standalone,
)

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def target(redis_target: RedisTarget) -> RedisTarget:
    """Standalone and cluster (tests/conftest.py)."""
    return redis_target


def make_tier(target: RedisTarget, registry: CollectorRegistry | None = None, *,
              lease_s: float = 5.0, ttl_s: int = 600, max_image_bytes: int = 20 * MiB) -> RedisSharedTier:
    cache = CacheSettings(redis_url=target.url, redis_cluster=target.cluster, cache_ttl_s=ttl_s,
                          redis_connect_timeout_s=1.0, redis_io_timeout_s=1.0, key_prefix="t:",
                          fill_wait_s=lease_s)
    media = MediaSettings(max_image_bytes=max_image_bytes)
    tier = build_shared_tier(cache, media, registry if registry is not None else CollectorRegistry())
    assert isinstance(tier, RedisSharedTier)
    return tier


@pytest.fixture
async def tier(target: RedisTarget) -> AsyncIterator[RedisSharedTier]:
    t = make_tier(target)
    yield t
    await t.close()


def image(num_bytes: int = 50_000) -> LoadedImage:
    data = os.urandom(num_bytes)
    return LoadedImage(data=data, mime="image/jpeg", width=800, height=600,
                       digest=hashlib.sha256(data).hexdigest())


def new_key() -> str:
    return f"https://origin.example/{uuid.uuid4().hex}.jpg"


async def test_round_trip_with_ttl(target: RedisTarget) -> None:
    registry = CollectorRegistry()
    tier = make_tier(target, registry, ttl_s=600)
    key, img = new_key(), image(300_000)
    try:
        assert await tier.get(key) is None
        await tier.put(key, img)
        got = await tier.get(key)
    finally:
        await tier.close()
    assert got is not None
    assert (got.data, got.mime, got.width, got.height, got.digest) == (
        img.data, img.mime, img.width, img.height, img.digest)
    value_key, _ = tier.storage_keys(key)
    with target.raw() as raw:
        ttl = raw.ttl(value_key)
        assert 590 <= ttl <= 600
        assert raw.strlen(value_key) > img.num_bytes
    sample = registry.get_sample_value
    assert sample("mmgate_shared_cache_get_seconds_count", {"outcome": "hit", "size_bucket": "le_1mib"}) == 1
    assert sample("mmgate_shared_cache_get_seconds_count", {"outcome": "miss", "size_bucket": "unknown"}) == 1
    assert sample("mmgate_shared_cache_set_seconds_count", {"outcome": "success", "size_bucket": "le_1mib"}) == 1


async def test_large_entry_round_trip(tier: RedisSharedTier) -> None:
    key, img = new_key(), image(5 * MiB)  # checksummed in a thread
    await tier.put(key, img)
    got = await tier.get(key)
    assert got is not None and got.data == img.data


async def test_image_over_the_limit_is_not_stored(target: RedisTarget) -> None:
    tier = make_tier(target, max_image_bytes=1000)
    key = new_key()
    try:
        await tier.put(key, image(2000))
        assert await tier.get(key) is None
    finally:
        await tier.close()
    with target.raw() as raw:
        assert raw.exists(tier.storage_keys(key)[0]) == 0


def _flip(raw_value: bytes, offset: int) -> bytes:
    damaged = bytearray(raw_value)
    damaged[offset] ^= 0xFF
    return bytes(damaged)


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda v: _flip(v, len(v) - 10), id="payload-byte"),
        pytest.param(lambda v: _flip(v, 9), id="header-width"),
        pytest.param(lambda v: v[: len(v) - 1000], id="truncated"),
        pytest.param(lambda v: v[: HEADER_SIZE - 4], id="truncated-header"),
        pytest.param(lambda v: b"GIF89a not ours", id="foreign"),
    ],
)
async def test_damaged_entry_is_deleted_and_missed(target: RedisTarget, damage: object) -> None:
    registry = CollectorRegistry()
    tier = make_tier(target, registry)
    key, img = new_key(), image()
    value_key, _ = tier.storage_keys(key)
    try:
        await tier.put(key, img)
        with target.raw() as raw:
            stored = raw.get(value_key)
            assert isinstance(stored, bytes)
            raw.set(value_key, damage(stored))  # type: ignore[operator]
        assert await tier.get(key) is None
        with target.raw() as raw:
            assert raw.exists(value_key) == 0
        assert registry.get_sample_value("mmgate_shared_cache_corrupt_entries_total") == 1
        await tier.put(key, img)  # the loader refills it
        got = await tier.get(key)
        assert got is not None and got.data == img.data
    finally:
        await tier.close()


async def test_lease_one_fills_the_other_waits(target: RedisTarget) -> None:
    filler, waiter = make_tier(target), make_tier(target)  # two gateway processes
    key, img = new_key(), image()
    try:
        assert await filler.acquire_fill_lease(key) is True
        assert await waiter.acquire_fill_lease(key) is False
        wait = asyncio.create_task(waiter.wait_for_fill(key))
        await asyncio.sleep(0.1)
        assert not wait.done()
        await filler.put(key, img)
        got = await asyncio.wait_for(wait, 5)
        assert got is not None and got.data == img.data
        with target.raw() as raw:
            assert raw.exists(filler.storage_keys(key)[1]) == 0  # the put dropped the lease
        # The value exists now: nobody takes a lease for it, a waiter gets it at once.
        assert await waiter.acquire_fill_lease(key) is False
        got = await waiter.wait_for_fill(key)
        assert got is not None and got.digest == img.digest
    finally:
        await filler.close()
        await waiter.close()


async def test_lease_expiry_ends_the_wait(target: RedisTarget) -> None:
    filler, waiter = make_tier(target, lease_s=0.4), make_tier(target, lease_s=0.4)
    key = new_key()
    try:
        leased = time.monotonic()
        assert await filler.acquire_fill_lease(key) is True
        start = time.monotonic()
        assert await waiter.wait_for_fill(key) is None  # the filler never stores anything
        elapsed = time.monotonic() - start
        assert 0.3 <= elapsed <= 0.4 + 2.0 + 3.0  # lease TTL + op timeout + slack
        # On a loaded machine a poll may time out (fail-open) a little before the lease expires:
        # the take-over is checked once the lease's 0.4 s have surely passed.
        await asyncio.sleep(max(0.0, leased + 0.45 - time.monotonic()))
        assert await waiter.acquire_fill_lease(key) is True  # the next one takes over
    finally:
        await filler.close()
        await waiter.close()


async def test_release_lets_waiters_fall_back_at_once(target: RedisTarget) -> None:
    filler, waiter = make_tier(target, lease_s=30), make_tier(target, lease_s=30)
    key = new_key()
    try:
        assert await filler.acquire_fill_lease(key) is True
        wait = asyncio.create_task(waiter.wait_for_fill(key))
        await asyncio.sleep(0.05)
        await filler.release_fill_lease(key)  # the origin fetch failed
        assert await asyncio.wait_for(wait, 5) is None  # far sooner than the 30 s lease
        assert await waiter.acquire_fill_lease(key) is True
    finally:
        await filler.close()
        await waiter.close()


async def test_release_never_drops_someone_elses_lease(target: RedisTarget) -> None:
    first, second = make_tier(target, lease_s=0.2), make_tier(target, lease_s=30)
    key = new_key()
    _, lease_key = first.storage_keys(key)
    try:
        assert await first.acquire_fill_lease(key) is True
        await asyncio.sleep(0.3)  # first's lease expired
        assert await second.acquire_fill_lease(key) is True
        await first.release_fill_lease(key)
        await first.put(key, image())  # a late fill still stores, and leaves second's lease alone
        with target.raw() as raw:
            assert raw.exists(lease_key) == 1
        await second.release_fill_lease(key)
        with target.raw() as raw:
            assert raw.exists(lease_key) == 0
    finally:
        await first.close()
        await second.close()


async def test_keys_carry_the_prefix_and_no_url(target: RedisTarget, tier: RedisSharedTier) -> None:
    key = f"https://secret-host.example/{uuid.uuid4().hex}.png"
    await tier.put(key, image(1000))
    value_key, lease_key = tier.storage_keys(key)
    assert value_key.startswith("t:") and "secret-host" not in value_key
    with target.raw() as raw:
        assert raw.exists(value_key) == 1
        if target.servers is not None:
            assert raw.keyslot(value_key) == raw.keyslot(lease_key)


async def test_wrong_password_fails_open(tmp_path: Path) -> None:
    with running_standalone(tmp_path, password="s3cret") as server:
        good = RedisTarget("standalone", server.url, False, standalone=server)
        bad = RedisTarget("standalone", f"redis://:wrong@127.0.0.1:{server.port}", False)
        ok_tier, bad_tier = make_tier(good), make_tier(bad)
        key, img = new_key(), image()
        try:
            await ok_tier.put(key, img)
            assert (await ok_tier.get(key)) is not None
            assert await bad_tier.get(key) is None
            await bad_tier.put(key, img)
            assert await bad_tier.acquire_fill_lease(key) is True
            assert await bad_tier.wait_for_fill(key) is None
            await bad_tier.release_fill_lease(key)
        finally:
            await ok_tier.close()
            await bad_tier.close()


async def test_tls_and_password_through_the_url(tmp_path: Path) -> None:
    with running_standalone(tmp_path / "tls", password="s3cret", tls=True) as server:
        assert server.url.startswith("rediss://:s3cret@")
        good = RedisTarget("standalone", server.url, False, standalone=server)
        # A client that does not trust the server's certificate fails open.
        untrusting = RedisTarget("standalone", f"rediss://:s3cret@127.0.0.1:{server.port}", False)
        tls_tier, bad_tier = make_tier(good), make_tier(untrusting)
        key, img = new_key(), image()
        try:
            await tls_tier.put(key, img)
            got = await tls_tier.get(key)
            assert got is not None and got.data == img.data
            assert await bad_tier.get(key) is None
            assert await bad_tier.acquire_fill_lease(key) is True
        finally:
            await tls_tier.close()
            await bad_tier.close()
        with server.client() as raw:
            assert raw.exists(tls_tier.storage_keys(key)[0]) == 1
