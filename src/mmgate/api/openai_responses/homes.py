"""Which backend holds a stored response: a bounded, TTL'd map from response id to backend name.

vLLM keeps a response (``store``, ``background``) in the memory of the one replica that made it;
``GET``/``cancel`` ``/v1/responses/{id}`` and a follow-up with ``previous_response_id`` must reach
that replica, and another replica answers 404. The gateway records the id of every response it
relays (vLLM's own ``resp_…`` id, unchanged), so those requests go straight to its home. An id the
map does not hold (evicted, expired, another gateway relayed it, this gateway restarted) is looked
for on every backend (``GET /v1/responses/{id}``, cheap) before the client is told it is unknown.

Pure logic: the clock is passed in.
"""

from __future__ import annotations

from collections import OrderedDict

# Ids remembered (oldest evicted first) and how long one is remembered: a response a client
# follows up on a day later is found by the lookup on every backend.
MAX_HOMES = 65536
HOME_TTL_S = 24 * 3600.0


class ResponseHomes:
    """Response id → (backend name, time recorded), least recently recorded evicted first."""

    def __init__(self, *, max_entries: int = MAX_HOMES, ttl_s: float = HOME_TTL_S) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._homes: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._homes)

    def record(self, response_id: str, backend: str, now: float) -> None:
        self._homes[response_id] = (backend, now)
        self._homes.move_to_end(response_id)
        while len(self._homes) > self.max_entries:
            self._homes.popitem(last=False)

    def home(self, response_id: str, now: float) -> str | None:
        """The backend that made ``response_id``, or None when unknown or expired."""
        entry = self._homes.get(response_id)
        if entry is None:
            return None
        backend, at = entry
        if now - at > self.ttl_s:
            del self._homes[response_id]
            return None
        return backend
