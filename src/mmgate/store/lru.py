"""A least-recently-used map bounded by total bytes (and optionally by age). Pure: no asyncio."""

from __future__ import annotations

import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

# What one entry costs this map beyond its key and value: the (value, size, expiry) tuple with its
# numbers and the ordered dict's node (CPython 3.11, measured with tracemalloc: ~130 bytes).
ENTRY_BYTES = 130

K = TypeVar("K")
V = TypeVar("V")


class ByteLRU(Generic[K, V]):
    """LRU cache holding at most ``max_bytes`` of values, each sized by ``size_of``.

    A value larger than ``max_entry_bytes`` is not cached (``put`` returns False): one huge entry
    must not flush the whole cache. With ``ttl_s``, an entry older than that is a miss (the
    clock is injectable for tests). ``max_bytes == 0`` disables the cache.
    """

    def __init__(
        self,
        max_bytes: int,
        size_of: Callable[[V], int],
        *,
        max_entry_bytes: int | None = None,
        ttl_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        count_entries: bool = False,
        max_entries: int | None = None,
    ) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self.max_entry_bytes = max_bytes if max_entry_bytes is None else min(max_entry_bytes, max_bytes)
        self._size_of = size_of
        # count_entries: each entry also costs its key and this map's own bookkeeping, so the byte
        # budget bounds real memory even for tiny values. max_entries: a cap on the count itself.
        self._count_entries = count_entries
        self._max_entries = max_entries
        self._ttl_s = ttl_s
        self._clock = clock
        # key -> (value, size, expires_at or None)
        self._entries: OrderedDict[K, tuple[V, int, float | None]] = OrderedDict()
        self._num_bytes = 0

    @property
    def num_cached_bytes(self) -> int:
        return self._num_bytes

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: K) -> V | None:
        """The value (now most recently used), or None on a miss or an expired entry."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        value, _size, expires_at = entry
        if expires_at is not None and self._clock() >= expires_at:
            self.pop(key)
            return None
        self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> bool:
        """Insert or replace; evict least-recently-used entries to fit. False if not cached."""
        size = self._size_of(value)
        if self._count_entries:
            size += sys.getsizeof(key) + ENTRY_BYTES
        if size > self.max_entry_bytes or self.max_bytes == 0:
            self.pop(key)  # a stale smaller value under this key must not outlive the new one
            return False
        self.pop(key)
        expires_at = None if self._ttl_s is None else self._clock() + self._ttl_s
        self._entries[key] = (value, size, expires_at)
        self._num_bytes += size
        while self._num_bytes > self.max_bytes or (
            self._max_entries is not None and len(self._entries) > self._max_entries
        ):
            _old_key, (_old, old_size, _exp) = self._entries.popitem(last=False)
            self._num_bytes -= old_size
        return True

    def pop(self, key: K) -> V | None:
        """Remove and return the value under ``key`` (None when absent)."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self._num_bytes -= entry[1]
        return entry[0]

    def sizes(self) -> Iterator[tuple[K, int]]:
        """Each entry's key and size, least recently used first (recency untouched; do not change
        the map while iterating)."""
        return ((key, entry[1]) for key, entry in self._entries.items())

    def clear(self) -> None:
        self._entries.clear()
        self._num_bytes = 0
