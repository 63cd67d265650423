"""What the shared tier does about nodes that fail: a circuit breaker per node, and a rate limit on
its warnings so that an outage logs a line a minute, not one per request. Pure: the caller passes
the (monotonic) time; ``mmgate.store.redis.tier`` and ``mmgate.store.redis.health`` use them.
"""

from __future__ import annotations


class WarningLimiter:
    """Lets one warning through per ``interval_s``; counts the ones it holds back.

    ``allow(now)`` returns None to suppress, or the number of warnings suppressed since the last
    one let through (to print alongside it).
    """

    def __init__(self, interval_s: float = 60.0) -> None:
        self.interval_s = interval_s
        self._next_at: float | None = None
        self._suppressed = 0

    def allow(self, now: float) -> int | None:
        if self._next_at is not None and now < self._next_at:
            self._suppressed += 1
            return None
        self._next_at = now + self.interval_s
        suppressed, self._suppressed = self._suppressed, 0
        return suppressed


class NodeBreakers:
    """One circuit breaker per cache node (``"standalone"``, or a cluster master's ``host:port``).

    A failure opens the failing node's breaker only: its keys skip the cache (fail open without
    I/O) while keys on the other nodes keep hitting. A frozen or black-holed node would otherwise
    cost a full operation timeout for every get, lease and put of its keys. An open breaker stays
    open for at least ``cooldown_s``, then closes as soon as a probe of that node succeeds (the
    caller probes ``due_for_probe`` nodes in the background, so no request pays for a probe).
    ``cooldown_s = 0`` disables the breakers: every operation goes to its node.
    """

    def __init__(self, cooldown_s: float = 0.25) -> None:
        self.cooldown_s = cooldown_s
        self._opened_at: dict[str, float] = {}

    @property
    def open_nodes(self) -> list[str]:
        return list(self._opened_at)

    def is_open(self, node: str) -> bool:
        """True while ``node``'s keys should bypass the cache."""
        return node in self._opened_at

    def record_failure(self, node: str, now: float) -> bool:
        """Open ``node``'s breaker (True when it was closed until now)."""
        if self.cooldown_s <= 0:
            return False
        if node in self._opened_at:
            return False
        self._opened_at[node] = now
        return True

    def record_success(self, node: str) -> None:
        self._opened_at.pop(node, None)

    def due_for_probe(self, now: float) -> list[str]:
        """Open nodes whose minimum open time has passed."""
        return [n for n, at in self._opened_at.items() if now - at >= self.cooldown_s]
