"""Each tenant's share of a backend's processor cache, as the gateway sends into it.

vLLM's processor cache is one LRU by bytes for every request (``--mm-processor-cache-gb``): a
tenant that sends many new images evicts every other tenant's, whose references the gateway then
heals by sending their bytes again. The gateway's record of what each backend holds
(``mmgate.routing.BackendHoldings``: an LRU of processed sizes bounded like the backend's cache,
``--reuse-backend-cache-gb``) says, before a request is sent, which images its new ones would
push out. So, per backend:

* a tenant is *active* while it sent a request with an image there (bytes or a cache-only
  reference) within ``WINDOW_S``; its share is the modelled cache over the active tenants;
* a request whose new images (those the backend does not hold: they go with their bytes) would
  take its tenant past its share, and would evict an image of another active tenant that holds no
  more than its own share, is refused (``CacheShareError``: 429 with ``Retry-After``) before
  anything is sent. A tenant past its share may still send new images while what they push out is
  its own (or belongs to tenants past their share, or idle ones): it turns over its own part;
* references to images the backend holds, images larger than its whole cache (not kept there) and
  text cost nothing and are never refused; a tenant that holds nothing there is always let through
  once; with one active tenant (or no API keys) nothing is ever refused.

So a tenant's flood takes at most what the others leave of the cache, and another tenant's
images, used within the window, stay held. Requests admitted and not yet answered count as held
(the record learns an image once the backend answered). Each gateway keeps its own record.
Pure: no asyncio; the clock is injectable.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from mmgate.errors import CacheShareError
from mmgate.fleet import BackendHoldings
from mmgate.reuse.namespace import tag_of

# How long a tenant counts as active at a backend after its last request with an image there:
# an idle tenant's images are no longer kept from the others, so every refusal ends within it.
WINDOW_S = 60.0
# The longest Retry-After: the images a refusal protects may be used again (or their tenant go
# idle) sooner than the window says.
MAX_RETRY_AFTER_S = 10
# Per-tenant totals are recounted (a walk over the backend's record) when this gateway changed the
# record (``changed``), and at least this often (the routing sync changes it too).
_RECOUNT_S = 0.5
_MB = 1_000_000


class CacheShares:
    """Each tenant's activity at each backend, its pending sends, and the check (module docstring)."""

    def __init__(self, holdings: BackendHoldings, *, window_s: float = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.holdings = holdings
        self.window_s = window_s
        self._clock = clock
        self._seen: dict[str, dict[str, float]] = {}  # backend -> tenant tag -> last request with an image
        self._pending: dict[str, dict[str, int]] = {}  # backend -> tag -> bytes admitted, not answered yet
        self._totals: dict[str, tuple[float, dict[str, int]]] = {}  # backend -> (counted at, tag -> bytes)
        self._forgot_at = clock()

    def active_tenants(self, backend: str) -> dict[str, float]:
        """The tenants active at ``backend`` (tag → when last seen); forgets those no longer active."""
        seen = self._seen.get(backend)
        if seen is None:
            return {}
        horizon = self._clock() - self.window_s
        if min(seen.values()) <= horizon:
            seen = {tag: when for tag, when in seen.items() if when > horizon}
            if seen:
                self._seen[backend] = seen
            else:
                del self._seen[backend]
        return seen

    def admit(self, backend: str, tag: str, new_bytes: int) -> int:
        """A request of tenant ``tag`` (its keys' tag) with images goes to ``backend`` and sends
        ``new_bytes`` of processed size with their bytes (0: only references). Returns what it
        reserved (give it to ``release`` once the backend answered or failed), or raises
        ``CacheShareError`` (nothing reserved)."""
        now = self._clock()
        if now - self._forgot_at >= self.window_s:  # a walk over every backend: once a window
            self._forget_idle(now)
        self._seen.setdefault(backend, {})[tag] = now
        if not new_bytes:
            return 0
        active = self.active_tenants(backend)
        if len(active) > 1:
            self._check(backend, tag, new_bytes, active, now)
        pending = self._pending.setdefault(backend, {})
        pending[tag] = pending.get(tag, 0) + new_bytes
        return new_bytes

    def release(self, backend: str, tag: str, reserved: int) -> None:
        """What ``admit`` reserved: the backend answered (the record now holds it) or failed."""
        pending = self._pending.get(backend)
        if not reserved or pending is None or tag not in pending:
            return
        left = pending[tag] - reserved
        if left > 0:
            pending[tag] = left
        else:
            del pending[tag]
            if not pending:
                del self._pending[backend]

    def changed(self, backend: str) -> None:
        """This gateway changed what it believes ``backend`` holds: its totals are counted again."""
        self._totals.pop(backend, None)

    def _check(self, backend: str, tag: str, new_bytes: int, active: dict[str, float], now: float) -> None:
        holdings = self.holdings
        pending = self._pending.get(backend, {})
        share = holdings.budget_bytes // len(active)
        excess = holdings.held_bytes(backend) + sum(pending.values()) + new_bytes - holdings.budget_bytes
        if excess <= 0:
            return  # room for them: nothing is evicted
        totals = self._tenant_totals(backend, now)
        mine = totals.get(tag, 0) + pending.get(tag, 0)
        if mine == 0 or mine + new_bytes <= share:
            return  # within its share (or its first images there): what it evicts is the others' excess
        # What the backend's LRU would evict for them, oldest first: anything of a tenant that is
        # active and within its share makes this a refusal.
        freed = 0
        protected: set[str] = set()
        for key, size in holdings.held_oldest_first(backend):
            owner = tag_of(key)
            if owner != tag and owner in active and totals.get(owner, 0) + pending.get(owner, 0) <= share:
                protected.add(owner)
                break
            freed += size
            if freed >= excess:
                break
        if not protected:
            return
        wait = min(active[owner] + self.window_s - now for owner in protected)
        raise CacheShareError(
            f"this API key's new images would evict other keys' images from a backend's image cache: it holds "
            f"{mine / _MB:.1f} MB of processed images there, past its share of {share / _MB:.1f} MB while other keys "
            "use it too; retry later, or refer to images already sent by their uuid (cache-only references are "
            "not limited)",
            retry_after_s=max(1, min(MAX_RETRY_AFTER_S, math.ceil(wait))))

    def _tenant_totals(self, backend: str, now: float) -> dict[str, int]:
        """Processed bytes each tenant holds at ``backend`` in the record (recounted at most every
        ``_RECOUNT_S``: a walk over the record)."""
        counted = self._totals.get(backend)
        if counted is not None and now - counted[0] < _RECOUNT_S:
            return counted[1]
        totals: dict[str, int] = {}
        for key, size in self.holdings.held_oldest_first(backend):
            owner = tag_of(key)
            totals[owner] = totals.get(owner, 0) + size
        self._totals[backend] = (now, totals)
        return totals

    def _forget_idle(self, now: float) -> None:
        """Forget the counts of backends with no tenant active (a backend that left the fleet)."""
        self._forgot_at = now
        for backend in [b for b, (at, _) in self._totals.items() if now - at > self.window_s]:
            del self._totals[backend]
        for backend in list(self._seen):
            self.active_tenants(backend)
