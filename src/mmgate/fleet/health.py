"""The health state machine of one backend (pure: the caller passes the monotonic time), and the
active probe that feeds it.

    HEALTHY ──(eject_after_failures consecutive failures)──▶ EJECTED
    EJECTED ──(a success at least readmit_after_s after the ejection)──▶ HEALTHY

A failure is a failed request the gateway reports (connect error, timeout) or a failed active probe;
a success is a request that reached the backend or a probe it answered. Successes reset the failure
count. ``readmit_after_s`` is a minimum time out: the replies of requests that were already in flight
when the backend was ejected, or one lucky probe right after, do not bring a failing backend back
at once (no flapping).
"""

from __future__ import annotations

import asyncio
import logging

from mmgate.backends import Backend
from mmgate.errors import MmgateError

log = logging.getLogger(__name__)


class BackendHealth:
    """Consecutive-failure ejection with time-gated re-admission, for one backend (its bounds are
    the settings': ``eject_after_failures`` at least 1, ``readmit_after_s`` not negative)."""

    __slots__ = ("consecutive_failures", "eject_after_failures", "ejected_at", "readmit_after_s")

    def __init__(self, *, eject_after_failures: int, readmit_after_s: float) -> None:
        self.eject_after_failures = eject_after_failures
        self.readmit_after_s = readmit_after_s
        self.consecutive_failures = 0
        self.ejected_at: float | None = None  # None: HEALTHY; else EJECTED since then

    @property
    def is_healthy(self) -> bool:
        return self.ejected_at is None

    def record_failure(self, now: float) -> bool:
        """Count one failure; True when this failure ejected the backend."""
        self.consecutive_failures += 1
        if self.ejected_at is None and self.consecutive_failures >= self.eject_after_failures:
            self.ejected_at = now
            return True
        return False

    def record_success(self, now: float) -> bool:
        """Count one success; True when it re-admitted an ejected backend."""
        self.consecutive_failures = 0
        if self.ejected_at is None or now - self.ejected_at < self.readmit_after_s:
            return False
        self.ejected_at = None
        return True


async def probe(backend: Backend, timeout_s: float) -> bool:
    """One active check of ``backend``: True when it answered its health endpoint in time."""
    try:
        async with asyncio.timeout(timeout_s):
            return await backend.healthy()
    except (TimeoutError, MmgateError):
        # No answer in time, or a backend error: the probe failed, which is its answer.
        return False
    except Exception:
        # A bug in a backend's probe must not stop the others: count it as failed and say so.
        log.exception("health probe of %s raised", backend.name)
        return False
