"""The uuid store's local tier shared fairly between tenants (``FairShareLRU``, pure): a tenant's
flood evicts its own entries once it holds the most, a tenant within an equal share is never
evicted by another, a tenant alone may use the whole budget, and the byte bound always holds."""

from __future__ import annotations

import sys

from mmgate.reuse.fair_lru import FairShareLRU
from mmgate.reuse.namespace import KeySpace
from mmgate.store.lru import ENTRY_BYTES

KEYS = KeySpace(b"k" * 32)
A, B = KEYS.tenant_tag("a"), KEYS.tenant_tag("b")


def cost(key: str, size: int = 1000) -> int:
    return size + sys.getsizeof(key) + ENTRY_BYTES


def test_a_flood_evicts_the_flooder_not_the_other_tenant() -> None:
    one = cost(f"{A}/u000")
    lru: FairShareLRU[int] = FairShareLRU(10 * one, lambda v: v)
    for i in range(3):
        assert lru.put(f"{B}/u{i:03}", 1000)
    for i in range(500):  # A floods: 50 times the budget
        lru.put(f"{A}/u{i:03}", 1000)
        assert lru.num_cached_bytes <= lru.max_bytes
    assert all(lru.get(f"{B}/u{i:03}") == 1000 for i in range(3))  # B's three survived
    assert lru.tenant_bytes(B) == 3 * one and lru.tenant_bytes(A) == 7 * one
    assert lru.get(f"{A}/u499") == 1000 and lru.get(f"{A}/u000") is None  # A's own LRU order
    assert len(lru) == 10


def test_a_tenant_over_its_share_is_trimmed_back_to_the_largest() -> None:
    one = cost(f"{A}/u000")
    lru: FairShareLRU[int] = FairShareLRU(10 * one, lambda v: v)
    for i in range(10):  # A alone: the whole budget
        lru.put(f"{A}/u{i:03}", 1000)
    assert lru.tenant_bytes(A) == 10 * one
    for i in range(8):  # B arrives: A (the largest) gives way until B holds as much
        lru.put(f"{B}/u{i:03}", 1000)
    assert lru.tenant_bytes(A) == 5 * one and lru.tenant_bytes(B) == 5 * one
    assert lru.get(f"{B}/u000") is None and lru.get(f"{B}/u007") == 1000  # then B evicts its own


def test_ttl_too_big_and_replace() -> None:
    now = [0.0]
    lru: FairShareLRU[int] = FairShareLRU(5000, lambda v: v, ttl_s=10, clock=lambda: now[0])
    assert not lru.put(f"{A}/big", 6000) and lru.get(f"{A}/big") is None
    assert lru.put(f"{A}/x", 100) and lru.put(f"{A}/x", 200)
    assert lru.get(f"{A}/x") == 200 and lru.num_cached_bytes == cost(f"{A}/x", 200)
    now[0] = 11.0
    assert lru.get(f"{A}/x") is None and lru.num_cached_bytes == 0 and len(lru) == 0
