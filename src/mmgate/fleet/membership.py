"""The fleet: the backends routed to as it changes (docs/ROUTING.md, "The fleet at run time"), the
models each serves (learnt from their ``/v1/models``), each one's health (``BackendHealth``, fed by
the gateway's reports and ``probe_once``), its load (requests in flight from this gateway) and its
metric series. A backend is known by its name: a hash key and a metric label (session ids and
image keys are hash keys only, never labels).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry

from mmgate.backends import Backend
from mmgate.config import GatewaySettings
from mmgate.errors import MmgateError, ModelNotFoundError
from mmgate.fleet.health import BackendHealth, probe
from mmgate.fleet.holdings import BackendHoldings
from mmgate.fleet.retire import Retirements
from mmgate.metrics import GatewayMetrics

log = logging.getLogger(__name__)


def _check_names(backends: Sequence[Backend]) -> None:
    if not backends:
        raise ValueError("at least one backend is required")
    names = [b.name for b in backends]
    if len(set(names)) != len(names):
        raise ValueError(f"backend names must be unique (they are hash keys and labels): {names}")


class Fleet:
    """The backends, their models, health and load, and the record of what each holds (``holdings``)."""

    def __init__(
        self, backends: Sequence[Backend], settings: GatewaySettings, *, metrics: GatewayMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        _check_names(backends)
        self.backends = list(backends)
        self._current = {b.name: b for b in self.backends}
        self._metrics = metrics if metrics is not None else GatewayMetrics(CollectorRegistry())
        self._health_timeout_s = settings.health_timeout_s
        self._health_interval_s = settings.health_interval_s
        self.holdings = BackendHoldings.for_settings(settings)
        self._clock = clock
        self._new_health = lambda: BackendHealth(
            eject_after_failures=settings.eject_after_failures, readmit_after_s=settings.readmit_after_s)
        self._health = {b.name: self._new_health() for b in self.backends}
        self._retirements = Retirements(settings.drain_timeout_s)  # its tasks: model refreshes too
        self._models: dict[str, list[Backend]] = {}
        self._answered = False
        for backend in self.backends:
            self._adopt(backend)

    # Membership -------------------------------------------------------------------------------

    def set_backends(self, backends: Sequence[Backend]) -> None:
        """Make ``backends`` the fleet, on the event loop the router runs on (docs/ROUTING.md, "The
        fleet at run time"): a name that stays keeps its state, a new one joins healthy and empty
        and becomes a candidate once a background refresh has learnt its models, one that goes is
        forgotten at once. The fleet owns every backend it was given: it closes a retired one
        (gone, or replaced by another object) once its requests in flight have ended."""
        _check_names(backends)
        asyncio.get_running_loop()  # retirements and the model refresh are tasks on it
        given = {b.name: b for b in backends}
        joined = [b for b in backends if b.name not in self._current]
        for name, old in self._current.items():
            new = given.get(name)
            if new is old:
                continue
            self._retirements.retire(old, counts_for_name=new is not None)
            if new is None:
                self._retirements.name_left(name)
                del self._health[name]
                self._metrics.forget_backend(name)  # labels stay bounded by the fleet
        self.holdings.retain(given)  # also what requests answered by departed ones recorded since
        for backend in joined:
            self._health[backend.name] = self._new_health()
        self.backends, self._current = list(backends), given
        models = {m: [given[b.name] for b in bs if b.name in given] for m, bs in self._models.items()}
        self._models = {m: bs for m, bs in models.items() if bs}
        for backend in backends:
            self._adopt(backend)
        if joined:
            self._retirements.spawn(self.refresh_models(), "mmgate-router-refresh")

    # Models -----------------------------------------------------------------------------------

    @property
    def models(self) -> list[str]:
        """Every model some backend serves (or served when it last answered), sorted."""
        return sorted(self._models)

    async def refresh_models(self) -> None:
        """Ask every backend which models it serves (unreachable ones keep their last answer, so do
        the ones that joined while it asked; the ones that left are dropped)."""
        asked = list(self.backends)
        results = await asyncio.gather(*(b.models() for b in asked), return_exceptions=True)
        served = {id(b): [m for m, bs in self._models.items() if b in bs] for b in self.backends}
        for backend, result in zip(asked, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, MmgateError):
                    raise result
                log.warning("model refresh failed for %s: %s", backend.name, result.message)
            elif id(backend) in served:
                self._answered = True
                served[id(backend)] = result
        models: dict[str, list[Backend]] = {}
        for backend in self.backends:
            for model in served[id(backend)]:
                models.setdefault(model, []).append(backend)
        self._models = models

    def candidates(self, model: str) -> list[Backend]:
        """Every backend serving ``model``, healthy or not (all backends while none ever answered)."""
        found = self._models.get(model)
        if found:
            return found
        if not self._answered:
            # No backend has ever answered: send it on, so the client sees the real failure (502/504).
            return self.backends
        # vLLM's own text, with the names it would list (every model the fleet serves).
        raise ModelNotFoundError(f"The model `{model}` does not exist. Valid aliases: {', '.join(sorted(self._models))}.",
                                 param="model")

    # Load -------------------------------------------------------------------------------------

    def outstanding(self, backend: Backend) -> int:
        """Requests in flight to ``backend`` (between ``begin`` and ``end``; 0 once it left)."""
        return self._retirements.load(backend.name, self._current.get(backend.name))

    def begin(self, backend: Backend) -> None:
        """One more request in flight to ``backend``; pair every call with ``end``."""
        self._retirements.begin(backend)

    def end(self, backend: Backend) -> None:
        """One request to ``backend`` finished (its stream included); never goes below zero."""
        self._retirements.end(backend)

    # Health -----------------------------------------------------------------------------------

    def is_healthy(self, backend: Backend) -> bool:
        """False for a backend that left the fleet."""
        health = self._health.get(backend.name)
        return health is not None and health.is_healthy

    def report_failure(self, backend: Backend) -> None:
        """A request to ``backend`` failed in a way that says it is down (connect error, timeout);
        ignored once it left the fleet."""
        health = self._health.get(backend.name)
        if health is not None and health.record_failure(self._clock()):
            log.warning("backend %s ejected after %d consecutive failure(s)", backend.name,
                        self._health[backend.name].consecutive_failures)
            self._metrics.backend_ejections.labels(backend.name).inc()
            self._publish_health(backend)

    def report_success(self, backend: Backend) -> None:
        """``backend`` answered (any HTTP status): resets its failures, may re-admit it."""
        health = self._health.get(backend.name)
        if health is not None and health.record_success(self._clock()):
            log.info("backend %s re-admitted", backend.name)
            # Back from an ejection it may have restarted: believe it holds no image.
            self.holdings.forget_backend(backend.name)
            self._publish_health(backend)

    async def probe_once(self) -> None:
        """One round of active checks: probe every backend concurrently, then refresh the models."""
        asked = list(self.backends)
        results = await asyncio.gather(*(probe(b, self._health_timeout_s) for b in asked))
        for backend, ok in zip(asked, results, strict=True):
            if ok:
                self.report_success(backend)
            else:
                self.report_failure(backend)
        await self.refresh_models()

    async def _probe_loop(self) -> None:
        while True:
            try:
                await self.probe_once()
            except Exception:
                # A failed round must never kill the loop: the next round retries.
                log.exception("health probe round failed")
            await asyncio.sleep(self._health_interval_s)

    async def close_backends(self) -> None:
        """Close every backend, the retired ones still draining too."""
        closing = [*self.backends, *self._retirements.waiting()]
        await asyncio.gather(*(b.close() for b in closing), return_exceptions=True)

    def _adopt(self, backend: Backend) -> None:
        """Count ``backend``'s requests in flight and publish its series (again: idempotent); its
        in-flight gauge is read when scraped."""
        self._retirements.track(backend)
        self._publish_health(backend)
        name = backend.name
        self._metrics.backend_in_flight(name, lambda: self._retirements.load(name, self._current.get(name)))

    def _publish_health(self, backend: Backend) -> None:
        self._metrics.backend_healthy.labels(backend.name).set(1 if self.is_healthy(backend) else 0)
