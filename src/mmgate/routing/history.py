"""What one gateway remembers of the images it sent: a bounded LRU of image key → who got it.

Per image: the backends recently sent it (most recent last), and whether it has been seen with
more than one session — a *shared* image — or only with the session that first sent it, its
*own* image. The ``lru-history`` routing mode (like llm-d's ``mm-cache-affinity-scorer``) scores
backends by the holders; ``image-affinity`` sends a session's own images to the session's home and
shared ones to their own homes. It is local to one gateway process and only a belief: a backend may
have evicted the image since. Pure and bounded: ``max_keys`` images, ``max_holders`` backends each;
a session is kept as a 64-bit hash, never as its id.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable

_NO_SESSION = -1


def session_token(session_id: str | None) -> int:
    """A stable 64-bit stand-in for a session id (``-1``: no session)."""
    if session_id is None:
        return _NO_SESSION
    return int.from_bytes(hashlib.blake2b(session_id.encode(), digest_size=8).digest(), "big")


class _Entry:
    __slots__ = ("holders", "owner", "shared")

    def __init__(self, owner: int) -> None:
        self.holders: list[str] = []
        self.owner = owner
        self.shared = owner == _NO_SESSION  # an image sent without a session belongs to nobody


class ImageHistory:
    """Bounded LRU of image key → the backends that recently got it, and its sharing."""

    def __init__(self, max_keys: int = 100_000, *, max_holders: int = 8) -> None:
        if max_keys < 1 or max_holders < 1:
            raise ValueError("max_keys and max_holders must be at least 1")
        self.max_keys = max_keys
        self.max_holders = max_holders
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def holders(self, key: str) -> tuple[str, ...]:
        """Backends believed to hold ``key``, least recent first (does not refresh recency)."""
        entry = self._entries.get(key)
        return tuple(entry.holders) if entry is not None else ()

    def holds(self, key: str, backend: str) -> bool:
        entry = self._entries.get(key)
        return entry is not None and backend in entry.holders

    def knows(self, key: str) -> bool:
        """True when ``key`` was sent before (and not yet forgotten by the LRU)."""
        return key in self._entries

    def is_shared(self, key: str, session_id: str | None) -> bool:
        """True when ``key`` was seen without a session or with a session other than this one;
        False for an image never seen (it is the request's own) or seen only with this session."""
        entry = self._entries.get(key)
        if entry is None:
            return False
        return entry.shared or entry.owner != session_token(session_id)

    def record(
        self, backend: str, keys: Iterable[str], session_id: str | None = None, *, token: int | None = None,
    ) -> None:
        """``backend`` was just sent every key in ``keys``, for ``session_id`` (or the session whose
        ``session_token`` is ``token``: another gateway's request, ``mmgate.routing.sync``)."""
        if token is None:
            token = session_token(session_id)
        for key in keys:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry(token)
            else:
                self._entries.move_to_end(key)
                if token != entry.owner:
                    entry.shared = True
                if backend in entry.holders:
                    entry.holders.remove(backend)
            entry.holders.append(backend)
            if len(entry.holders) > self.max_holders:
                del entry.holders[0]
        while len(self._entries) > self.max_keys:
            self._entries.popitem(last=False)

    def forget_backend(self, backend: str) -> None:
        """``backend`` lost its cache (restarted or re-admitted): it holds nothing any more. The
        sharing of each image is kept: it is about the clients, not the backend."""
        for entry in self._entries.values():
            if backend in entry.holders:
                entry.holders.remove(backend)
