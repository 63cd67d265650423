"""The UUID store: backend uuid → the image's encoded bytes, tenant-scoped, on the same local and
shared tiers as the image caches (its own key space), with a TTL. The local tier is shared fairly
between tenants (``mmgate.reuse.fair_lru``): one tenant's flood of uuids evicts its own, not
another's.

It is what lets the gateway heal a backend's cache miss and resolve cache-only references for
backends that have no uuid cache. Filled whenever a uuid arrives with its image.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from mmgate.reuse.fair_lru import FairShareLRU
from mmgate.store import LoadedImage, SharedTier

log = logging.getLogger(__name__)
SHARED_PREFIX = "uuid:"


class UUIDStore:
    """uuid → LoadedImage, local byte-bounded LRU (fair between tenants) with TTL in front of the
    optional shared tier.

    Writes to the shared tier run in the background (a request never waits on Redis for them);
    at most ``max_pending_writes`` at once — past that a write is skipped (fail-open: the entry
    is still local, and the next turn that carries the image writes it again).
    """

    def __init__(
        self, local_bytes: int, ttl_s: float, shared: SharedTier | None = None, *, max_pending_writes: int = 64
    ) -> None:
        self._local: FairShareLRU[LoadedImage] = FairShareLRU(
            local_bytes, size_of=lambda i: i.footprint_bytes, ttl_s=ttl_s)
        self._shared = shared
        self._pending: set[asyncio.Task[None]] = set()
        self._max_pending = max_pending_writes

    @property
    def num_cached_bytes(self) -> int:
        return self._local.num_cached_bytes

    def tenant_bytes(self, tag: str) -> int:
        """Local bytes the tenant ``tag`` holds (``KeySpace.tenant_tag``; "" without tenants)."""
        return self._local.tenant_bytes(tag)

    def __len__(self) -> int:
        return len(self._local)

    def put(self, uuid: str, image: LoadedImage) -> None:
        """Remember ``image`` under ``uuid`` (local now, shared in the background)."""
        known = self._local.get(uuid)
        if known is not None and known.digest == image.digest:
            return  # already stored (the shared write happened when it was first put)
        self._local.put(uuid, image)
        if self._shared is not None and len(self._pending) < self._max_pending:
            task = asyncio.create_task(self._shared.put(SHARED_PREFIX + uuid, image))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    def peek(self, uuid: str) -> LoadedImage | None:
        """The image under ``uuid`` in the local tier only (no I/O)."""
        return self._local.get(uuid)

    async def get(self, uuid: str) -> LoadedImage | None:
        """The image stored under ``uuid``, from the local tier or else the shared one."""
        image = self._local.get(uuid)
        if image is not None or self._shared is None:
            return image
        image = await self._shared.get(SHARED_PREFIX + uuid)
        if image is not None:
            self._local.put(uuid, image)
        return image

    async def close(self) -> None:
        """Let pending shared writes finish (each is bounded by the tier's own timeouts)."""
        if self._pending:
            with contextlib.suppress(Exception):
                await asyncio.gather(*self._pending, return_exceptions=True)
