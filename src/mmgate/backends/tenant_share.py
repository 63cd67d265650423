"""Each tenant's share of one backend's connections.

A request holds one of its backend's connections from the moment it is sent until its reply was
read whole or its stream released; a tenant whose clients never read their streams would hold
every one, and every other tenant's request would wait for a free connection until it timed out.
So with API keys a tenant's requests hold at most half of a backend's connections (rounded up:
``--backend-max-connections`` 3 gives each tenant 2, 1024 gives 512, the default
``--max-tenant-requests``); past it a request is answered 429 at once, and the other half stays
for the other tenants. Without API keys there are no tenants and no share. One connection cannot
be shared: with ``--backend-max-connections 1`` a tenant may hold it.

Pure bookkeeping, no I/O: the tenant comes from the request's record (``mmgate.observe``).
"""

from __future__ import annotations

from collections.abc import Callable

from mmgate.backends.base import BackendReply
from mmgate.errors import TenantConnectionsError


def tenant_share(max_connections: int) -> int:
    """The most connections of a backend with ``max_connections`` one tenant may hold."""
    return max(1, -(-max_connections // 2))


def _nothing() -> None:
    return None


class ConnectionShares:
    """The connections each tenant's requests hold on one backend (module docstring)."""

    __slots__ = ("_held", "backend", "max_connections", "share")

    def __init__(self, backend: str, max_connections: int) -> None:
        self.backend = backend
        self.max_connections = max_connections
        self.share = tenant_share(max_connections)
        self._held: dict[str, int] = {}

    def held(self, tenant: str) -> int:
        return self._held.get(tenant, 0)

    def take(self, tenant: str | None) -> Callable[[], None]:
        """One more connection for ``tenant`` (None: no tenants, nothing counted); the function
        that gives it back (idempotent). ``TenantConnectionsError`` at the tenant's share."""
        if tenant is None:
            return _nothing
        held = self._held.get(tenant, 0)
        if held >= self.share:
            raise TenantConnectionsError(
                f"tenant {tenant!r} already holds {held} of backend {self.backend}'s {self.max_connections} "
                f"connections, its share (half of --backend-max-connections); retry once some of its requests "
                "have finished")
        self._held[tenant] = held + 1
        given = False

        def give_back() -> None:
            nonlocal given
            if not given:
                given = True
                left = self._held[tenant] - 1
                if left:
                    self._held[tenant] = left
                else:
                    del self._held[tenant]

        return give_back


def holding(reply: BackendReply, give_back: Callable[[], None]) -> BackendReply:
    """``reply``, its connection counted for its tenant until it is given back: at once for a
    whole reply (its connection is back in the pool already), with ``release`` for a stream."""
    if give_back is _nothing:
        return reply
    if reply.stream is None:
        give_back()
        return reply
    release = reply._release

    def release_both() -> None:
        try:
            if release is not None:
                release()
        finally:
            give_back()

    reply._release = release_both
    return reply
