"""A backend's load as the whole fleet puts it on it, without shared state on the request path.

One gateway's in-flight count sees only its own share: with G gateways in front of the same
backends each caps a G-th of the traffic, so a bounded-load cap spills too early and too late.
The engine knows better: vLLM reports its running and waiting requests (every gateway's) on
``/metrics``. The router polls them off the request path (``Router.start``: every
``load_poll_interval_s``, each read bounded by its timeout) and records each reading here with
its own in-flight count at that moment. The load a decision uses is then

    max(own in-flight now, engine reading + (own in-flight now - own in-flight at the reading))

— the engine's figure moved by what this gateway started and finished since (the requests it
sent after the poll are not in it yet), never below what this gateway alone has in flight (the
engine does not count requests still in its image processing; a request may end before the engine
saw it). A backend without a reading, whose last poll failed, or whose reading is older than
``max_age_s`` uses its own in-flight count: the estimate fails open to the one-gateway view.

Pure: the caller passes the clock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class _Reading:
    engine: int
    own_then: int
    at: float


class FleetLoad:
    """The latest engine-reported load of each backend and the estimate built on it."""

    def __init__(self, max_age_s: float) -> None:
        if max_age_s <= 0:
            raise ValueError("max_age_s must be positive")
        self.max_age_s = max_age_s
        self._readings: dict[str, _Reading] = {}

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
        return max(own_now, reading.engine + own_now - reading.own_then)
