"""The UUID store: local LRU with TTL in front of a real Redis (standalone), tenant keys apart
from the image caches' keys, shared writes in the background, reads back from a fresh process."""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys

from prometheus_client import CollectorRegistry

from mmgate.config import CacheSettings, MediaSettings
from mmgate.reuse import UUIDStore
from mmgate.reuse.store import SHARED_PREFIX
from mmgate.store import LoadedImage, RedisSharedTier, build_shared_tier
from mmgate.store.lru import ENTRY_BYTES
from tests.support.redis_servers import RedisServer


def image(num_bytes: int = 2000) -> LoadedImage:
    data = os.urandom(num_bytes)
    return LoadedImage(data=data, mime="image/png", width=10, height=10, digest=hashlib.sha256(data).hexdigest())


def tier(server: RedisServer, registry: CollectorRegistry | None = None) -> RedisSharedTier:
    cache = CacheSettings(redis_url=server.url, redis_connect_timeout_s=1.0, redis_io_timeout_s=1.0,
                          key_prefix=f"store-{os.urandom(4).hex()}:")
    shared = build_shared_tier(cache, MediaSettings(), registry or CollectorRegistry())
    assert isinstance(shared, RedisSharedTier)
    return shared


async def test_local_put_peek_get_and_byte_bound() -> None:
    one = image()
    per_entry = one.footprint_bytes + sys.getsizeof("u1") + ENTRY_BYTES  # the key and the map's bookkeeping too
    store = UUIDStore(local_bytes=2 * per_entry + 10, ttl_s=60)
    assert store.peek("u1") is None and await store.get("u1") is None
    store.put("u1", one)
    assert store.peek("u1") is one and await store.get("u1") is one
    store.put("u2", image())
    store.put("u3", image())  # over the budget: the least recent goes
    assert len(store) == 2 and store.peek("u1") is None
    assert store.num_cached_bytes <= 2 * per_entry + 10
    await store.close()


async def test_ttl_expires_local_entries() -> None:
    store = UUIDStore(local_bytes=1 << 20, ttl_s=0.05)
    store.put("u", image())
    await asyncio.sleep(0.1)
    assert store.peek("u") is None
    await store.close()


async def test_shared_tier_serves_another_gateway(standalone_server: RedisServer) -> None:
    shared = tier(standalone_server)
    first = UUIDStore(local_bytes=1 << 20, ttl_s=60, shared=shared)
    stored = image()
    first.put("t1/u1", stored)
    await first.close()  # waits for the background write
    second = UUIDStore(local_bytes=1 << 20, ttl_s=60, shared=shared)
    assert second.peek("t1/u1") is None  # nothing local in the second process
    found = await second.get("t1/u1")
    assert found is not None and found.data == stored.data and found.digest == stored.digest
    assert second.peek("t1/u1") is not None  # now local too
    # Its own key space: the image caches' key for the same string is not it.
    assert await shared.get("t1/u1") is None and await shared.get(SHARED_PREFIX + "t1/u1") is not None
    await second.close()
    await shared.close()


async def test_a_repeat_of_the_same_image_writes_once(standalone_server: RedisServer) -> None:
    registry = CollectorRegistry()
    shared = tier(standalone_server, registry)
    store = UUIDStore(local_bytes=1 << 20, ttl_s=60, shared=shared)
    same = image()
    for _ in range(3):
        store.put("u", same)  # same digest: no second write
    store.put("v", image())
    await store.close()
    sets = registry.get_sample_value("mmgate_shared_cache_set_seconds_count",
                                     {"outcome": "success", "size_bucket": "le_64kib"})
    assert sets == 2
    assert await shared.get(SHARED_PREFIX + "u") is not None
    await shared.close()
