"""What the byte-bounded caches count per entry is what an entry really costs, measured with
tracemalloc (within 25%), for tiny, small and medium images: a budget bounds real memory however
small the images are."""

from __future__ import annotations

import hashlib
import os
import tracemalloc

import pytest

from mmgate.fleet import BackendHoldings
from mmgate.reuse.store import UUIDStore
from mmgate.store import ByteLRU, LoadedImage


def images(count: int, size: int) -> list[LoadedImage]:
    out = []
    for _ in range(count):
        data = os.urandom(size)
        out.append(LoadedImage(data=data, mime="image/png", width=4, height=4, digest=hashlib.sha256(data).hexdigest()))
    return out


def keys(count: int, prefix: str) -> list[str]:
    return [prefix + hashlib.sha256(str(i).encode()).hexdigest() for i in range(count)]


@pytest.mark.parametrize("size", [68, 1_000, 20_000])
def test_local_cache_counts_what_an_entry_really_costs(size: int) -> None:
    count = 4000 if size < 10_000 else 500
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    lru: ByteLRU[str, LoadedImage] = ByteLRU(10**12, lambda i: i.footprint_bytes, count_entries=True)
    for key, image in zip(keys(count, "url:"), images(count, size), strict=True):
        image.data_url()  # forwarded once: the data URL is part of what the cache keeps alive
        lru.put(key, image)
    real = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    counted = lru.num_cached_bytes
    assert 0.8 * real <= counted <= 1.25 * real, (size, counted / count, real / count)


async def test_uuid_store_counts_what_an_entry_really_costs() -> None:
    count = 4000
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    store = UUIDStore(10**12, 3600)
    for key, image in zip(keys(count, "t0/"), images(count, 68), strict=True):
        image.data_url()
        store.put(key, image)
    real = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert 0.8 * real <= store.num_cached_bytes <= 1.25 * real


def test_what_a_backend_holds_is_bounded_in_entries_not_only_in_modelled_backend_bytes() -> None:
    holdings = BackendHoldings(4 * 1024**3, max_entries=1000, max_keys=1000)
    for key in keys(5000, "~sha256:"):
        holdings.hold("b0", [(key, 1024)])
    assert holdings.num_held("b0") == 1000
