"""A byte-bounded LRU shared fairly between tenants: the uuid store's local tier.

A plain LRU lets one tenant flush everyone: six 20 MB images, or a flood of small ones, and every
other tenant's uuids are gone. Here every tenant (the tag that leads a backend key,
``mmgate.reuse.namespace``) has an LRU of its own under one byte budget, and when the budget is
full the tenant holding the most bytes gives up its least recently used entry, whoever is putting.
So a tenant that floods evicts its own entries once it holds more than any other, and a tenant
holding no more than an equal share of the budget (``max_bytes`` / tenants holding anything) is
never evicted by another; a tenant alone may use the whole budget. Pure: no asyncio.
"""

from __future__ import annotations

import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

from mmgate.reuse.namespace import tag_of
from mmgate.store.lru import ENTRY_BYTES

V = TypeVar("V")

class FairShareLRU(Generic[V]):
    """``key → value`` under ``max_bytes`` (each entry: ``size_of(value)``, its key and the map's
    bookkeeping), partitioned by ``tag_of(key)``, with a TTL (module docstring)."""

    def __init__(self, max_bytes: int, size_of: Callable[[V], int], *, ttl_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self._size_of = size_of
        self._ttl_s = ttl_s
        self._clock = clock
        # tenant tag -> key -> (value, size, expires_at); a tenant with no entry has no map
        self._tenants: dict[str, OrderedDict[str, tuple[V, int, float | None]]] = {}
        self._bytes: dict[str, int] = {}
        self._num_bytes = 0

    @property
    def num_cached_bytes(self) -> int:
        return self._num_bytes

    def tenant_bytes(self, tag: str) -> int:
        """Bytes the tenant ``tag`` holds now."""
        return self._bytes.get(tag, 0)

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._tenants.values())

    def get(self, key: str) -> V | None:
        """The value (now its tenant's most recently used), or None on a miss or an expired entry."""
        entries = self._tenants.get(tag_of(key))
        entry = entries.get(key) if entries is not None else None
        if entries is None or entry is None:
            return None
        value, _size, expires_at = entry
        if expires_at is not None and self._clock() >= expires_at:
            self.pop(key)
            return None
        entries.move_to_end(key)
        return value

    def put(self, key: str, value: V) -> bool:
        """Insert or replace, then evict to fit (module docstring). False when the value alone is
        larger than the whole budget (not kept)."""
        self.pop(key)
        size = self._size_of(value) + sys.getsizeof(key) + ENTRY_BYTES
        if size > self.max_bytes:
            return False
        tag = tag_of(key)
        expires_at = None if self._ttl_s is None else self._clock() + self._ttl_s
        self._tenants.setdefault(tag, OrderedDict())[key] = (value, size, expires_at)
        self._bytes[tag] = self._bytes.get(tag, 0) + size
        self._num_bytes += size
        while self._num_bytes > self.max_bytes:
            largest = max(self._bytes, key=self._bytes.__getitem__)
            oldest = next(iter(self._tenants[largest]))
            self.pop(oldest)
        return True

    def pop(self, key: str) -> V | None:
        """Remove and return the value under ``key`` (None when absent)."""
        tag = tag_of(key)
        entries = self._tenants.get(tag)
        entry = entries.pop(key, None) if entries is not None else None
        if entries is None or entry is None:
            return None
        self._num_bytes -= entry[1]
        self._bytes[tag] -= entry[1]
        if not entries:
            del self._tenants[tag], self._bytes[tag]
        return entry[0]
