"""Each tenant's share of what the gateway sends into a backend's processor cache.

vLLM's processor cache is one LRU by bytes for every request (``--mm-processor-cache-gb``): a
tenant that sends many new images evicts every other tenant's, whose references the gateway then
heals by sending their bytes again. So, per backend, this ledger keeps what each tenant sent there
*for processing* (images with their bytes: the ones the backend does not hold) within the cache's
turnover, and a tenant past its share gets a 429 (``CacheShareError``) before anything is sent:

* the turnover is the last ``cache_bytes`` of processed size sent to the backend (the modelled
  cache, ``--reuse-backend-cache-gb``, as ``mmgate.routing.BackendHoldings`` sizes it), and at most
  ``WINDOW_S``: what was sent earlier has left the cache, or its sender's refusals end anyway;
* a tenant is *active* at a backend while it sent a request with an image there (bytes or a
  cache-only reference) within ``WINDOW_S``; the share is ``cache_bytes`` / active tenants;
* with two or more active tenants, a request whose new images would take its tenant past its
  share is refused — unless the tenant sent nothing within the turnover (one request is always
  let through, however large). Images the backend already holds go as cache-only references and
  cost nothing here; text costs nothing; with one active tenant (or none configured: every key
  has the same empty tag) nothing is ever refused.

So a tenant that floods takes at most its share of the cache per turnover, and another tenant's
images, used since, stay held. Each gateway keeps its own ledger (like its record of holdings).
Pure: no asyncio; the clock is injectable.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable

from mmgate.errors import CacheShareError

# How long a tenant counts as active at a backend after its last image request there, and the
# longest a send counts against its tenant: a tenant's refusals always end within it.
WINDOW_S = 60.0
_MB = 1_000_000


class _Ledger:
    """One backend's sends within the turnover (oldest first) and its tenants' activity."""

    __slots__ = ("by_tenant", "last_seen", "sends", "tenant_sends", "total")

    def __init__(self) -> None:
        self.sends: deque[tuple[float, str, int]] = deque()  # (when, tenant tag, processed bytes)
        self.tenant_sends: dict[str, deque[tuple[float, int]]] = {}
        self.by_tenant: dict[str, int] = {}
        self.total = 0
        self.last_seen: dict[str, float] = {}

    def drop_oldest(self) -> None:
        _when, tag, size = self.sends.popleft()
        self.total -= size
        left = self.by_tenant[tag] - size
        own = self.tenant_sends[tag]
        own.popleft()
        if own:
            self.by_tenant[tag] = left
        else:
            del self.by_tenant[tag], self.tenant_sends[tag]


class CacheShares:
    """Per backend, each tenant's processed bytes sent within the cache's turnover, and the check
    that refuses a tenant past its fair share (module docstring)."""

    def __init__(self, cache_bytes: int, *, max_entries: int, window_s: float = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if cache_bytes < 0 or max_entries < 1 or window_s <= 0:
            raise ValueError("cache_bytes must not be negative, max_entries at least 1, window_s positive")
        self.cache_bytes = cache_bytes
        self.max_entries = max_entries
        self.window_s = window_s
        self._clock = clock
        self._ledgers: dict[str, _Ledger] = {}
        self._next_sweep = clock() + window_s

    def sent_bytes(self, backend: str, tag: str) -> int:
        """Processed bytes the tenant ``tag`` sent ``backend`` within the turnover."""
        ledger = self._ledgers.get(backend)
        if ledger is None:
            return 0
        self._trim(ledger, self._clock())
        return ledger.by_tenant.get(tag, 0)

    def active_tenants(self, backend: str) -> int:
        """Tenants that sent ``backend`` a request with an image within the window."""
        ledger = self._ledgers.get(backend)
        if ledger is None:
            return 0
        self._trim(ledger, self._clock())
        return len(ledger.last_seen)

    def admit(self, backend: str, tag: str, sizes: Iterable[int]) -> None:
        """A request of tenant ``tag`` (its keys' tag: ``mmgate.reuse.shares.tenant_of``) with
        images goes to ``backend``, sending these processed sizes with their bytes (none: only
        references). Counts them, or raises ``CacheShareError`` (nothing counted) when they would
        take the tenant past its share."""
        now = self._clock()
        self._sweep(now)
        ledger = self._ledgers.get(backend)
        if ledger is None:
            ledger = self._ledgers[backend] = _Ledger()
        self._trim(ledger, now)
        ledger.last_seen[tag] = now
        sizes = list(sizes)
        new = sum(sizes)
        active = len(ledger.last_seen)
        sent = ledger.by_tenant.get(tag, 0)
        share = self.cache_bytes // max(1, active)
        if new and active > 1 and sent and sent + new > share:
            raise CacheShareError(
                f"this API key's new images would take it past its share of a backend's image cache "
                f"({sent / _MB:.1f} MB of processed images sent within the cache's turnover, {new / _MB:.1f} MB "
                f"more asked, share {share / _MB:.1f} MB while other keys use the backend too): retry later, "
                "or refer to images already sent by their uuid (cache-only references are not limited)",
                retry_after_s=self._retry_after(ledger, tag, sent + new - share, now))
        self.charge(backend, tag, sizes)

    def charge(self, backend: str, tag: str, sizes: Iterable[int]) -> None:
        """Count sizes sent to ``backend`` without the check (a heal re-sends what it must)."""
        now = self._clock()
        ledger = self._ledgers.get(backend)
        if ledger is None:
            ledger = self._ledgers[backend] = _Ledger()
        for size in sizes:
            ledger.sends.append((now, tag, size))
            ledger.tenant_sends.setdefault(tag, deque()).append((now, size))
            ledger.by_tenant[tag] = ledger.by_tenant.get(tag, 0) + size
            ledger.total += size
        self._trim(ledger, now)

    def _sweep(self, now: float) -> None:
        """At most once a window: forget backends with nothing left in their window (a backend that
        left the fleet, or that no image request reached for a while)."""
        if now < self._next_sweep:
            return
        self._next_sweep = now + self.window_s
        for backend, ledger in list(self._ledgers.items()):
            self._trim(ledger, now)
            if not ledger.sends and not ledger.last_seen:
                del self._ledgers[backend]

    def _trim(self, ledger: _Ledger, now: float) -> None:
        """Drop sends past the turnover (bytes, entries, age) and tenants no longer active."""
        horizon = now - self.window_s
        sends = ledger.sends
        while sends and (ledger.total > self.cache_bytes or len(sends) > self.max_entries or sends[0][0] <= horizon):
            ledger.drop_oldest()
        if ledger.last_seen and min(ledger.last_seen.values()) <= horizon:
            ledger.last_seen = {tag: seen for tag, seen in ledger.last_seen.items() if seen > horizon}

    def _retry_after(self, ledger: _Ledger, tag: str, excess: int, now: float) -> int:
        """Whole seconds until enough of the tenant's sends have aged out to admit ``excess`` more."""
        freed, last = 0, now
        for sent_at, size in ledger.tenant_sends.get(tag, ()):
            freed, last = freed + size, sent_at
            if freed >= excess:
                break
        # Past its last send the tenant has nothing within the turnover: one request always passes.
        return max(1, math.ceil(last + self.window_s - now))
