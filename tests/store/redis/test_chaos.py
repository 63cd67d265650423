"""The shared tier under faults, with real redis-server processes: a standalone
server and a 3-master cluster; one node, the seed node and every node frozen (SIGSTOP), killed and
restarted. Checked: every operation within its bound (no retry, redirect or topology refresh on
top), keys on healthy nodes keep hitting, hits resume within a second of the cluster being ok,
a fresh client's first concurrent calls all succeed (a gateway learns the cluster's map before it
serves), and no fill lease outlives the fill wait."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
import uuid
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Literal, TypeVar

import pytest
from prometheus_client import CollectorRegistry
from redis.crc import key_slot

from mmgate.config import CacheSettings, MediaSettings
from mmgate.media.keys import url_key
from mmgate.media.loader import MediaLoader
from mmgate.store.redis.tier import RedisSharedTier, build_shared_tier
from mmgate.store.types import LoadedImage
from tests.support.gateway import gateway_settings, running_gateway
from tests.support.images import make_image
from tests.support.origin import ImageOrigin
from tests.support.redis_servers import RedisClusterServers, RedisServer, running_cluster, running_standalone

T = TypeVar("T")
CONNECT_S, IO_S = 0.2, 0.3
OP_S = CONNECT_S + IO_S
# Scheduling noise on two shared cores. A client retry, a second redirect or a topology refresh
# inside an operation would each add another whole OP_S.
SLACK_S = 0.4
FILL_WAIT_S = 1.0  # the default
RESUME_S = 1.0  # hits resume within this of the server (cluster) being ok again


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    with running_cluster(tmp_path_factory.mktemp("chaos-cluster")) as servers:
        yield servers


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[RedisServer]:
    with running_standalone(tmp_path) as server:
        yield server


def make_tier(url: str, *, cluster: bool, registry: CollectorRegistry | None = None,
              connect_s: float = CONNECT_S, io_s: float = IO_S) -> RedisSharedTier:
    """A tier with the defaults (breaker cool-down, fill wait) and short socket timeouts."""
    cache = CacheSettings(redis_url=url, redis_cluster=cluster, redis_connect_timeout_s=connect_s,
                          redis_io_timeout_s=io_s)
    tier = build_shared_tier(cache, MediaSettings(allowed_private=("127.0.0.1",)),
                             registry or CollectorRegistry())
    assert isinstance(tier, RedisSharedTier)
    return tier


def image() -> LoadedImage:
    data = os.urandom(8_000)
    return LoadedImage(data=data, mime="image/png", width=8, height=8, digest=hashlib.sha256(data).hexdigest())


def new_key() -> str:
    return f"https://origin.example/{uuid.uuid4().hex}.png"


async def timed(call: Awaitable[T]) -> tuple[T, float]:
    start = time.monotonic()
    result = await call
    return result, time.monotonic() - start


async def stored_keys(tier: RedisSharedTier, cluster: RedisClusterServers, per_node: int = 4) -> dict[int, list[str]]:
    """``per_node`` stored keys on each master, by port (every one a hit now)."""
    by_port: dict[int, list[str]] = {n.port: [] for n in cluster.nodes}
    while min(len(v) for v in by_port.values()) < per_node:
        keys = [new_key() for _ in range(12)]
        owners = cluster.nodes_for_keys([tier.storage_keys(k)[0] for k in keys])
        for key, owner in zip(keys, owners, strict=True):
            if len(by_port[owner.port]) < per_node:
                await tier.put(key, image())
                assert await tier.get(key) is not None
                by_port[owner.port].append(key)
    return by_port


async def key_on(tier: RedisSharedTier, cluster: RedisClusterServers, node: RedisServer) -> str:
    while True:
        keys = [new_key() for _ in range(12)]
        for key, owner in zip(keys, cluster.nodes_for_keys([tier.storage_keys(k)[0] for k in keys]),
                              strict=True):
            if owner is node:
                return key


async def resume_time(tier: RedisSharedTier, key: str, within_s: float = 10.0) -> float:
    """Seconds until ``key`` can be stored and read back (polled every 20 ms)."""
    img, start = image(), time.monotonic()
    while time.monotonic() - start < within_s:
        await tier.put(key, img)
        if await tier.get(key) is not None:
            return time.monotonic() - start
        await asyncio.sleep(0.02)
    return float("inf")


async def start(tier: RedisSharedTier) -> None:
    await tier.start()  # what the gateway does before it serves


# --- one node, the seed node: frozen or killed -------------------------------------------------


@pytest.mark.parametrize("fault", ["freeze", "kill"])
@pytest.mark.parametrize("victim_index", [1, 0], ids=["one-node", "seed-node"])
async def test_cluster_node_fault_is_contained_and_bounded(
    cluster: RedisClusterServers, fault: Literal["freeze", "kill"], victim_index: int
) -> None:
    tier = make_tier(cluster.url, cluster=True)
    victim = cluster.nodes[victim_index]
    try:
        await start(tier)
        keys = await stored_keys(tier, cluster)
        healthy = [k for port, ks in keys.items() if port != victim.port for k in ks]
        down = keys[victim.port]
        victim.freeze() if fault == "freeze" else victim.stop()
        latencies: list[float] = []
        healthy_hits = healthy_gets = 0
        try:
            end = time.monotonic() + 1.5  # short of cluster-node-timeout (5 s): no failover talk
            while time.monotonic() < end:
                got = await asyncio.gather(*(timed(tier.get(k)) for k in healthy + down))
                latencies += [t for _, t in got]
                healthy_hits += sum(img is not None for img, _ in got[: len(healthy)])
                healthy_gets += len(healthy)
                await asyncio.sleep(0.02)
        finally:
            victim.thaw() if fault == "freeze" else victim.start()
            cluster.wait_ready()
        assert max(latencies) <= OP_S + SLACK_S, f"a get took {max(latencies):.2f}s, bound {OP_S}s"
        assert healthy_hits >= 0.9 * healthy_gets, f"{healthy_hits}/{healthy_gets} healthy-node hits"
        # The node serves again: its keys hit again within a second.
        assert await resume_time(tier, await key_on(tier, cluster, victim)) <= RESUME_S
    finally:
        await tier.close()


# --- every node --------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["freeze", "kill"])
async def test_cluster_all_nodes_down_bounded_then_hits_resume(
    cluster: RedisClusterServers, fault: Literal["freeze", "kill"]
) -> None:
    tier = make_tier(cluster.url, cluster=True)
    try:
        await start(tier)
        keys = [k for ks in (await stored_keys(tier, cluster, per_node=2)).values() for k in ks]
        for node in cluster.nodes:
            node.freeze() if fault == "freeze" else node.stop()
        try:
            for _ in range(3):
                calls = [timed(tier.get(k)) for k in keys]
                calls += [timed(tier.acquire_fill_lease(k)) for k in keys]
                calls += [timed(tier.put(k, image())) for k in keys]
                results = await asyncio.gather(*calls)
                worst = max(t for _, t in results)
                assert worst <= OP_S + SLACK_S, f"a call took {worst:.2f}s, bound {OP_S}s"
                assert all(r is None for r, _ in results[: len(keys)])
                await asyncio.sleep(0.3)
        finally:
            if fault == "freeze":
                for node in cluster.nodes:
                    node.thaw()
            else:
                cluster.start()  # same ports, nodes.conf kept: returns when cluster_state is ok
            cluster.wait_ready()
        assert await resume_time(tier, new_key()) <= RESUME_S
    finally:
        await tier.close()


async def test_cluster_fresh_client_first_concurrent_calls_all_succeed(cluster: RedisClusterServers) -> None:
    writer = make_tier(cluster.url, cluster=True)
    keys = [new_key() for _ in range(32)]
    try:
        for key in keys:
            await writer.put(key, image())
    finally:
        await writer.close()
    for started in (False, True):
        registry = CollectorRegistry()
        # The default timeouts (0.5 s + 0.5 s): 32 connections opened at once on two busy cores.
        tier = make_tier(cluster.url, cluster=True, registry=registry, connect_s=0.5, io_s=0.5)
        try:
            if started:
                await start(tier)
            got = await asyncio.gather(*(tier.get(k) for k in keys))
        finally:
            await tier.close()
        errors = registry.get_sample_value(
            "mmgate_shared_cache_get_seconds_count", {"outcome": "error", "size_bucket": "unknown"})
        assert (errors or 0) == 0 and all(g is not None for g in got), f"started={started}"


# --- the fill lease ----------------------------------------------------------------------------


async def test_lease_of_a_write_skipped_during_an_outage_stalls_nobody(
    standalone: RedisServer, origin: ImageOrigin
) -> None:
    name = f"{uuid.uuid4().hex}.png"
    origin.add(name, make_image("PNG", 16, 16))
    url = origin.url(f"/slow-headers/{name}?delay=0.6")
    _, lease_key = make_tier(standalone.url, cluster=False).storage_keys(url_key(url))
    media = MediaSettings(allowed_private=("127.0.0.1",))
    cache = CacheSettings(local_cache_bytes=0)
    first, second = make_tier(standalone.url, cluster=False), make_tier(standalone.url, cluster=False)
    loaders = [MediaLoader(media, cache, shared=first), MediaLoader(media, cache, shared=second)]
    try:
        filling = asyncio.create_task(loaders[0].load(url))  # takes the lease, fetches for 0.6 s
        await asyncio.sleep(0.15)
        standalone.freeze()  # another request's operation fails meanwhile
        try:
            assert await first.get(new_key()) is None
        finally:
            standalone.thaw()
        await filling  # its write was skipped: the node's breaker was open
        with standalone.client() as raw:
            assert raw.pttl(lease_key) <= FILL_WAIT_S * 1000  # gone, or about to be
        # Another process asks for the image: it waits at most the fill wait, then fetches.
        _, elapsed = await timed(asyncio.wait_for(loaders[1].load(url), 10))
        assert elapsed <= FILL_WAIT_S + 0.6 + 2 * OP_S + SLACK_S
    finally:
        for loader in loaders:
            await loader.close()
        await first.close()
        await second.close()


async def test_lease_released_when_the_write_is_refused(standalone: RedisServer, origin: ImageOrigin) -> None:
    name = f"{uuid.uuid4().hex}.png"
    origin.add(name, make_image("PNG", 16, 16))
    url = origin.url(f"/slow-headers/{name}?delay=0.4")
    tier = make_tier(standalone.url, cluster=False)
    _, lease_key = tier.storage_keys(url_key(url))
    loader = MediaLoader(MediaSettings(allowed_private=("127.0.0.1",)), CacheSettings(local_cache_bytes=0),
                         shared=tier)
    with standalone.client() as raw:
        try:
            filling = asyncio.create_task(loader.load(url))
            await asyncio.sleep(0.2)
            assert raw.exists(lease_key) == 1  # taken; the fetch is under way
            raw.config_set("maxmemory", 1)  # now every write is refused (OOM); deletes still work
            await filling
            assert raw.exists(lease_key) == 0  # released at once, not left to expire
        finally:
            raw.config_set("maxmemory", 0)
            await loader.close()
            await tier.close()


async def test_gateway_learns_the_cluster_map_before_it_serves(cluster: RedisClusterServers) -> None:
    settings = gateway_settings(cache={"redis_url": cluster.url, "redis_cluster": True})
    async with running_gateway(settings) as gw:
        tier = gw.gateway.loader._shared  # the tier the gateway built
        assert isinstance(tier, RedisSharedTier)
        assert tier.nodes.known  # before any request: the first ones never race a discovery
        assert len(tier.nodes.names()) == len(cluster.nodes)


async def test_cluster_ask_and_moved_redirects_are_followed_once(cluster: RedisClusterServers) -> None:
    tier = make_tier(cluster.url, cluster=True)
    try:
        await start(tier)
        key = new_key()
        await tier.put(key, image())
        value_key = tier.storage_keys(key)[0]
        src = cluster.node_for_key(value_key)
        dst = next(n for n in cluster.nodes if n is not src)
        slot = key_slot(value_key.encode())
        ids = {}
        for node in (src, dst):
            with node.client() as c:
                ids[node.port] = c.execute_command("CLUSTER", "MYID").decode()
        with src.client() as s, dst.client() as d:
            d.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[src.port])
            s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[dst.port])
            s.execute_command("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", value_key)
        # src answers ASK; dst serves the key only after ASKING on the same connection.
        got, elapsed = await timed(tier.get(key))
        assert got is not None and elapsed <= OP_S + SLACK_S
        await asyncio.sleep(0.3)  # the refresh the redirect asked for is over
        refreshes = tier.nodes.refreshes  # type: ignore[union-attr]
        for node in cluster.nodes:
            with node.client() as c:
                c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[dst.port])
        # The map still says src: src answers MOVED, followed at once and written into the map.
        got, elapsed = await timed(tier.get(key))
        assert got is not None and elapsed <= OP_S + SLACK_S
        assert tier.nodes.refreshes == refreshes  # type: ignore[union-attr]  # no refresh did it
        route = tier.nodes.route(value_key)
        assert route is not None and route[0] == f"127.0.0.1:{dst.port}"
    finally:
        await tier.close()
