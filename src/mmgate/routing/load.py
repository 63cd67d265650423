"""A backend's load as the whole fleet puts it on it, without shared state on the request path.

One gateway's in-flight count sees only its own share: with G gateways in front of the same
backends each caps a G-th of the traffic, so a bounded-load cap spills too early and too late.
The engine knows better: vLLM reports its running and waiting requests (every gateway's) on
``/metrics``, and with ``--enable-server-load-tracking`` every HTTP request it holds, image
processing included, on ``/load`` (``Backend.load`` reads both, the larger wins). ``LoadPoller``
polls them off the request path (every ``load_poll_interval_s``, each read bounded by its
timeout) and records each reading in ``FleetLoad`` with this gateway's own in-flight count at
that moment. The load a decision uses is then

    max(own in-flight now, engine reading + share x (own in-flight now - own in-flight at the reading))

— the engine's figure moved by what this gateway started and finished since (the requests it
sent after the poll are not in it yet), never below what this gateway alone has in flight (a
request may end before the engine saw it). ``share`` is the fleet's load per request of this
gateway (the readings ÷ this gateway's in-flight requests at them, smoothed, 1 to ``max_share``):
the other gateways start and finish requests since the poll too, which this one cannot see, so it
assumes they do as it does. Without it, every gateway spends the same headroom a poll showed and
the fleet overshoots the cap (G gateways x the headroom). A backend without a reading, whose
last poll failed, or whose reading is older than ``max_age_s`` uses its own in-flight count: the
estimate fails open to the one-gateway view.

With the routing sync (``mmgate.routing.sync``) "own" is every synced gateway's in-flight count
(this one's exact, the others' as they last said), and ``share`` tends to 1 when only those
gateways load the backends.

``FleetLoad`` is pure (the caller passes the clock); ``LoadPoller`` is its I/O.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mmgate.backends import Backend
from mmgate.errors import MmgateError
from mmgate.metrics import GatewayMetrics

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Reading:
    engine: int
    own_then: int
    at: float


class FleetLoad:
    """The latest engine-reported load of each backend and the estimate built on it."""

    def __init__(self, max_age_s: float, *, max_share: float = 8.0) -> None:
        if max_age_s <= 0:
            raise ValueError("max_age_s must be positive")
        if max_share < 1:
            raise ValueError("max_share must be at least 1")
        self.max_age_s = max_age_s
        self.max_share = max_share
        self.share = 1.0
        self._readings: dict[str, _Reading] = {}

    def end_round(self, now: float) -> None:
        """Every backend was polled: update ``share``, the fleet's load per request of this
        gateway (fresh readings summed ÷ this gateway's in-flight requests at them; smoothed)."""
        fresh = [r for r in self._readings.values() if now - r.at <= self.max_age_s]
        own = sum(r.own_then for r in fresh)
        if own < 1:
            return  # nothing of ours in flight: the ratio says nothing
        ratio = min(self.max_share, max(1.0, sum(r.engine for r in fresh) / own))
        self.share = 0.7 * self.share + 0.3 * ratio

    def record(self, backend: str, engine: int | None, own_now: int, now: float) -> None:
        """A poll of ``backend`` answered ``engine`` (None: it reports no load) while this gateway
        had ``own_now`` requests in flight to it."""
        if engine is None:
            self._readings.pop(backend, None)
        else:
            self._readings[backend] = _Reading(max(0, engine), own_now, now)

    def fail(self, backend: str) -> None:
        """A poll of ``backend`` failed: its estimate is this gateway's own count until the next."""
        self._readings.pop(backend, None)

    def engine(self, backend: str, now: float) -> int | None:
        """The engine's last fresh reading, or None."""
        reading = self._readings.get(backend)
        if reading is None or now - reading.at > self.max_age_s:
            return None
        return reading.engine

    def estimate(self, backend: str, own_now: int, now: float) -> int:
        """Requests in flight to ``backend`` from every gateway, as best this one can tell."""
        reading = self._readings.get(backend)
        if reading is None or now - reading.at > self.max_age_s:
            return own_now
        return max(own_now, round(reading.engine + self.share * (own_now - reading.own_then)))


class LoadPoller:
    """Polls every backend's engine load into a ``FleetLoad``, one round each ``interval_s``."""

    def __init__(
        self, backends: Sequence[Backend], own: Callable[[str], int], *, interval_s: float, timeout_s: float,
        clock: Callable[[], float], metrics: GatewayMetrics | None = None,
    ) -> None:
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError("interval_s and timeout_s must be positive")
        self.backends = list(backends)
        # A reading older than two polls and a timeout is stale: polls stopped answering in time.
        self.fleet = FleetLoad(2 * interval_s + timeout_s)
        self._own = own
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._clock = clock
        self._metrics = metrics

    def estimate(self, backend: str) -> int:
        return self.fleet.estimate(backend, self._own(backend), self._clock())

    async def poll_once(self) -> None:
        """Read every backend's load once, concurrently (each read bounded)."""
        await asyncio.gather(*(self._poll(b) for b in self.backends))
        self.fleet.end_round(self._clock())

    async def _poll(self, backend: Backend) -> None:
        try:
            async with asyncio.timeout(self._timeout_s):
                engine = await backend.load(self._timeout_s)
        except (TimeoutError, MmgateError):
            # Slow or failing: fail open to this gateway's own count until a poll answers.
            self.fleet.fail(backend.name)
            outcome = "error"
        except Exception:
            # A bug in one backend's poll must not stop the others: count it as failed and say so.
            log.exception("load poll of %s raised", backend.name)
            self.fleet.fail(backend.name)
            outcome = "error"
        else:
            self.fleet.record(backend.name, engine, self._own(backend.name), self._clock())
            outcome = "ok" if engine is not None else "none"
        if self._metrics is not None:
            self._metrics.backend_load_polls.labels(backend.name, outcome).inc()
            self._metrics.backend_load.labels(backend.name).set(self.estimate(backend.name))

    async def run(self) -> None:
        """Poll until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                await self.poll_once()
            except Exception:
                # A failed round must never kill the loop: the next round retries.
                log.exception("load poll round failed")
            await asyncio.sleep(max(0.0, self._interval_s - (loop.time() - started)))
