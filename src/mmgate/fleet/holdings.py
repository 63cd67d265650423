"""What each backend holds, as far as this gateway can tell: the one record the router and the
sender both read (docs/ROUTING.md, "What it does", step 4). Pure and bounded.

* Per backend, a byte-bounded LRU of image key → its estimated processed size, sized like the
  backend's processor cache: the scorers weigh where an image is held, the sender strips an image
  the backend holds down to a cache-only reference.
* Per image, who showed it: the first session (a 64-bit token, never the id) and whether another
  session (or none) showed it since — a *shared* image. A fact about the clients, recorded as a
  request is routed, at most ``max_keys`` images (LRU).

It is a belief: a wrong one costs one healed cache miss.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator

from mmgate.config import GatewaySettings
from mmgate.store import ByteLRU

NO_SESSION = -1
# vLLM's processor cache holds pixel tensors: about 3 float32 values per pixel after resize.
PROCESSED_BYTES_PER_PIXEL = 12
PIXELS_PER_TOKEN = 28 * 28


def session_token(session_id: str | None) -> int:
    """A stable 64-bit stand-in for a session id (``NO_SESSION``: none)."""
    if session_id is None:
        return NO_SESSION
    return int.from_bytes(hashlib.blake2b(session_id.encode(), digest_size=8).digest(), "big")


def processed_bytes(tokens: float) -> int:
    """What an image of ``tokens`` prompt tokens takes in a backend's processor cache (estimate)."""
    return int(PROCESSED_BYTES_PER_PIXEL * PIXELS_PER_TOKEN * tokens) + 1024


class BackendHoldings:
    """Bounded record of the images each backend holds and of the sessions that showed each."""

    def __init__(self, budget_bytes: int, *, max_entries: int, max_keys: int) -> None:
        if budget_bytes < 0 or max_entries < 1 or max_keys < 1:
            raise ValueError("budget_bytes must not be negative, max_entries and max_keys at least 1")
        self.budget_bytes = budget_bytes
        self.max_entries = max_entries
        self.max_keys = max_keys
        self._held: dict[str, ByteLRU[str, int]] = {}
        self._nothing: ByteLRU[str, int] = ByteLRU(0, size_of=int, max_entries=1)  # a backend never recorded
        self._owners: OrderedDict[str, int] = OrderedDict()  # key -> its session's token, or NO_SESSION

    @classmethod
    def for_settings(cls, settings: GatewaySettings) -> BackendHoldings:
        """Sized by the gateway's reuse settings: the backend cache it assumes, the keys it tracks."""
        return cls(int(settings.reuse_backend_cache_gb * 1024**3), max_entries=settings.reuse_tracked_uuids,
                   max_keys=settings.reuse_tracked_uuids)

    # What each backend holds -----------------------------------------------------------------

    def _read(self, backend: str) -> ByteLRU[str, int]:
        return self._held.get(backend, self._nothing)

    def holds(self, backend: str, key: str) -> bool:
        """True when ``backend`` is believed to hold ``key`` (does not refresh its recency)."""
        return key in self._read(backend)

    def holders(self, key: str) -> list[str]:
        """The backends believed to hold ``key``."""
        return [backend for backend, lru in self._held.items() if key in lru]

    def hold(self, backend: str, images: Iterable[tuple[str, int]]) -> None:
        """``backend`` answered a request with these (key, processed bytes): it holds them now."""
        lru = self._held.get(backend)
        if lru is None:
            lru = self._held[backend] = ByteLRU(self.budget_bytes, size_of=int, max_entries=self.max_entries)
        for key, size in images:
            lru.put(key, size)

    def forget(self, backend: str, keys: Iterable[str]) -> None:
        """``backend`` missed one of ``keys`` in its cache: believe it holds none of them."""
        lru = self._read(backend)
        for key in keys:
            lru.pop(key)

    def forget_backend(self, backend: str) -> None:
        """``backend`` may have lost its cache (re-admitted after an ejection, or left the fleet): it
        holds nothing. Who showed each image is kept: that is about the clients, not the backend."""
        self._held.pop(backend, None)

    def retain(self, backends: Collection[str]) -> None:
        """Forget every backend not in ``backends`` (they left the fleet)."""
        for backend in [b for b in self._held if b not in backends]:
            del self._held[backend]

    def held_bytes(self, backend: str) -> int:
        """Estimated processed bytes ``backend`` holds."""
        return self._read(backend).num_cached_bytes

    def held_oldest_first(self, backend: str) -> Iterator[tuple[str, int]]:
        """(key, processed bytes) of each image ``backend`` holds, least recently used first: the
        order its cache evicts them in."""
        return self._read(backend).sizes()

    def num_held(self, backend: str) -> int:
        return len(self._read(backend))

    # Who showed each image -------------------------------------------------------------------

    def show(self, keys: Iterable[str], token: int) -> None:
        """A request of the session ``token`` (``session_token``) showed ``keys``."""
        for key in keys:
            owner = self._owners.get(key)
            if owner is None:
                self._owners[key] = token
            else:
                self._owners.move_to_end(key)
                if owner != token:
                    self._owners[key] = NO_SESSION
        while len(self._owners) > self.max_keys:
            self._owners.popitem(last=False)

    def knows(self, key: str) -> bool:
        """True when a request showed ``key`` before (and the LRU has not forgotten it)."""
        return key in self._owners

    def is_shared(self, key: str, session_id: str | None) -> bool:
        """True when ``key`` was shown without a session or by a session other than this one;
        False for an image never shown or shown only by this session (its *own* image)."""
        owner = self._owners.get(key)
        return owner is not None and (owner == NO_SESSION or owner != session_token(session_id))
