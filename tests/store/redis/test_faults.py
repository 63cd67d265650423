"""The shared tier under faults, with real redis-server processes: stopped, frozen (SIGSTOP),
restarted, and every cluster node restarted on the same ports. Every call must fail open within
its timeout, and hits must resume on the same tier object once the server is back."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from prometheus_client import CollectorRegistry

from mmgate.config import CacheSettings, MediaSettings
from mmgate.store.redis.tier import RedisSharedTier, build_shared_tier
from mmgate.store.types import LoadedImage
from tests.support.redis_servers import RedisClusterServers, RedisServer, running_cluster, running_standalone

T = TypeVar("T")

CONNECT_S = 0.2
IO_S = 0.3
OP_S = CONNECT_S + IO_S
SLACK_S = 2.0  # two shared cores: generous, still proves each call is bounded by its timeout


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[RedisServer]:
    with running_standalone(tmp_path) as server:
        yield server


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    with running_cluster(tmp_path_factory.mktemp("cluster")) as servers:
        yield servers


def make_tier(url: str, *, cluster: bool, cooldown_s: float = 0.0,
              registry: CollectorRegistry | None = None) -> RedisSharedTier:
    cache = CacheSettings(redis_url=url, redis_cluster=cluster, redis_connect_timeout_s=CONNECT_S,
                          redis_io_timeout_s=IO_S)
    media = MediaSettings(total_timeout_s=2.0)
    tier = build_shared_tier(cache, media, registry or CollectorRegistry(), error_cooldown_s=cooldown_s)
    assert isinstance(tier, RedisSharedTier)
    return tier


def image() -> LoadedImage:
    data = os.urandom(20_000)
    return LoadedImage(data=data, mime="image/png", width=10, height=10,
                       digest=hashlib.sha256(data).hexdigest())


def new_key() -> str:
    return f"https://origin.example/{uuid.uuid4().hex}.png"


async def bounded(call: Awaitable[T], limit_s: float = OP_S + SLACK_S) -> T:
    """Await ``call`` and check it returned within ``limit_s`` (it must not raise either)."""
    start = time.monotonic()
    result = await call
    elapsed = time.monotonic() - start
    assert elapsed <= limit_s, f"cache call took {elapsed:.2f}s, bound {limit_s:.2f}s"
    return result


async def assert_fails_open(tier: RedisSharedTier, key: str) -> None:
    """Every operation returns its fail-open answer within its bound."""
    assert await bounded(tier.get(key)) is None
    assert await bounded(tier.put(key, image())) is None
    assert await bounded(tier.acquire_fill_lease(key)) is True
    # wait_for_fill polls for at most the lease TTL; on an error it gives up at the first poll.
    assert await bounded(tier.wait_for_fill(key)) is None
    assert await bounded(tier.release_fill_lease(key)) is None


async def hits_resume(tier: RedisSharedTier, within_s: float = 15.0) -> float:
    """Put and get until a hit; return how long it took."""
    key, img = new_key(), image()
    start = time.monotonic()
    while time.monotonic() - start < within_s:
        await tier.put(key, img)
        got = await tier.get(key)
        if got is not None:
            assert got.data == img.data
            return time.monotonic() - start
        await asyncio.sleep(0.1)
    raise AssertionError(f"no shared hit within {within_s}s after the server came back")


async def hit_now(tier: RedisSharedTier) -> str:
    key, img = new_key(), image()
    await tier.put(key, img)
    assert await tier.get(key) is not None
    return key


# --- standalone -------------------------------------------------------------------------------


async def test_stopped_server_fails_open_then_hits_resume(standalone: RedisServer) -> None:
    tier = make_tier(standalone.url, cluster=False)
    try:
        key = await hit_now(tier)
        standalone.stop()
        await assert_fails_open(tier, key)
        standalone.start()
        await hits_resume(tier)
    finally:
        await tier.close()


async def test_restart_under_a_live_client(standalone: RedisServer) -> None:
    tier = make_tier(standalone.url, cluster=False)
    try:
        await hit_now(tier)
        standalone.restart()  # pooled connections are now dead
        await hits_resume(tier)
    finally:
        await tier.close()


async def test_frozen_server_calls_bounded_by_io_timeout(standalone: RedisServer) -> None:
    tier = make_tier(standalone.url, cluster=False)
    try:
        key = await hit_now(tier)
        standalone.freeze()
        try:
            await assert_fails_open(tier, key)
        finally:
            standalone.thaw()
        assert await tier.get(key) is not None  # same tier, same data: hits resume
    finally:
        await tier.close()


async def test_cooldown_skips_the_cache_after_a_failure(standalone: RedisServer) -> None:
    registry = CollectorRegistry()
    tier = make_tier(standalone.url, cluster=False, cooldown_s=1.0, registry=registry)
    try:
        key = await hit_now(tier)
        standalone.freeze()
        try:
            assert await bounded(tier.get(key)) is None  # pays the I/O timeout once
            assert await bounded(tier.get(key)) is None  # skipped: no I/O
            assert await tier.acquire_fill_lease(key) is True
        finally:
            standalone.thaw()
        assert registry.get_sample_value("mmgate_shared_cache_bypassed_total", {"operation": "get"}) == 1
        assert registry.get_sample_value("mmgate_shared_cache_bypassed_total", {"operation": "lease"}) == 1
        assert registry.get_sample_value(
            "mmgate_shared_cache_get_seconds_count", {"outcome": "error", "size_bucket": "unknown"}) == 2
        await asyncio.sleep(1.1)
        assert await tier.get(key) is not None
    finally:
        await tier.close()


async def test_warnings_are_rate_limited(standalone: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    tier = make_tier(standalone.url, cluster=False)
    standalone.stop()
    try:
        with caplog.at_level(logging.WARNING, logger="mmgate.store.redis.tier"):
            for _ in range(5):
                await assert_fails_open(tier, new_key())
    finally:
        await tier.close()
    warnings = [r for r in caplog.records if r.name == "mmgate.store.redis.tier"]
    assert len(warnings) == 1
    assert "failing open" in warnings[0].getMessage()


# --- cluster (one module-scoped cluster; every test leaves it running) -------------------------


async def test_cluster_frozen_node_calls_bounded(cluster: RedisClusterServers) -> None:
    tier = make_tier(cluster.url, cluster=True)
    try:
        key = await hit_now(tier)
        node = cluster.node_for_key(tier.storage_keys(key)[0])
        node.freeze()
        try:  # keep the freeze short of cluster-node-timeout (5 s): the cluster stays healthy
            assert await bounded(tier.get(key)) is None
            assert await bounded(tier.acquire_fill_lease(key)) is True
            assert await bounded(tier.wait_for_fill(key)) is None
        finally:
            node.thaw()
        await hits_resume(tier)
    finally:
        await tier.close()


async def test_cluster_stopped_fails_open_then_recovers(cluster: RedisClusterServers) -> None:
    tier = make_tier(cluster.url, cluster=True)
    try:
        key = await hit_now(tier)
        cluster.stop()
        try:  # RedisClusterException (not a RedisError) and connection errors both fail open
            await assert_fails_open(tier, key)
        finally:
            cluster.start()
        await hits_resume(tier)
    finally:
        await tier.close()


async def test_cluster_all_nodes_restarted_recovers_through_the_url(cluster: RedisClusterServers) -> None:
    tier = make_tier(cluster.url, cluster=True)
    try:
        keys = [await hit_now(tier) for _ in range(6)]  # spread over the three masters
        cluster.restart()  # same ports, new processes, no data
        await hits_resume(tier)
        assert all([await tier.get(k) is None for k in keys])  # data is gone, not stale
    finally:
        await tier.close()


async def test_cluster_map_is_learnt_through_the_configured_node_only(cluster: RedisClusterServers) -> None:
    tier = make_tier(cluster.url, cluster=True)
    try:
        await tier.start()
        await hit_now(tier)  # the tier knows all three masters
        assert sorted(tier.nodes.names()) == sorted(f"127.0.0.1:{n.port}" for n in cluster.nodes)
        seed = tier.nodes.seed.connection_pool.connection_kwargs  # type: ignore[union-attr]
        assert (seed["host"], seed["port"]) == ("127.0.0.1", cluster.nodes[0].port)
    finally:
        await tier.close()
