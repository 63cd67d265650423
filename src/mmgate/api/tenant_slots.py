"""Requests in flight per tenant: no one API key can hold every backend connection and engine slot
of the fleet (streams nobody reads, or simply too many at once).

``TenantSlots.hold(tenant)`` counts a request from its start to the end of its answer, streams
included; past the limit the request gets ``TenantLimitError`` (429 with ``Retry-After``) before its
body is read. Only tenants with a request in flight have an entry: the map is bounded by the
tenants of the API keys file. Plain class, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from mmgate.errors import TenantLimitError


class TenantSlots:
    """At most ``limit`` requests in flight per tenant (0: no limit)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._in_flight: dict[str, int] = {}

    def in_flight(self, tenant: str) -> int:
        return self._in_flight.get(tenant, 0)

    @contextmanager
    def hold(self, tenant: str) -> Iterator[None]:
        count = self._in_flight.get(tenant, 0)
        if self.limit and count >= self.limit:
            raise TenantLimitError(
                f"this API key already has {count} requests in flight, the gateway's limit per key "
                "(--max-tenant-requests): retry when one has finished")
        self._in_flight[tenant] = count + 1
        try:
            yield
        finally:
            left = self._in_flight[tenant] - 1
            if left:
                self._in_flight[tenant] = left
            else:
                del self._in_flight[tenant]
