"""Backend choice by a routing policy over the healthy backends; passive ejection and active
health probes; the one record of what each backend holds.

Backends are grouped by the models they serve, learnt from their ``/v1/models``; ``Router.models``
is the union the gateway's own ``/v1/models`` shows. For one request:

* candidates: the backends serving the model that are healthy (then the ejected ones);
* their order comes from the ``RoutingPolicy`` (``RoutingSettings.mode``, see
  ``mmgate.routing.policy``): by default ``image-affinity``, the images where they are held or at
  their rendezvous homes, a session's own images at the session's home, under a bounded-load cap.

Routing keys are the session id, configured backend names and each image's backend key
(tenant-scoped uuid or content hash, as the reuse plan computed it): a client can steer its own
requests by its images, but the load cap keeps any one image from piling a fleet's load on one
backend. No key is ever a metric label.

What each backend holds (``holdings``, ``mmgate.routing.holdings``) is the record the policy weighs
and the reuse sender strips by: the sender records a request's images once a backend answered it
and forgets them on a heal; the router records who showed them (``record_answered``), forgets a
backend's on its re-admission, and applies the other gateways' records from the routing sync.

Load: the policy balances by each backend's requests in flight (``begin``/``end``); with the
routing sync (``mmgate.routing.sync``) the gateways also tell each other what their backends
answered and how many requests each has in flight, and every gateway's count with it.

Health: ``report_failure`` (the gateway, on a connect error or a timeout) ejects a backend after
``eject_after_failures`` consecutive failures; ``start()`` runs one background task that probes every
backend each ``health_interval_s`` and re-admits ejected ones that answer (no sooner than
``readmit_after_s`` after their ejection), then refreshes the model lists. See ``health``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Sequence

from redis.asyncio import Redis

from mmgate.backends import Backend
from mmgate.config import GatewaySettings
from mmgate.errors import MmgateError, ModelNotFoundError
from mmgate.metrics import GatewayMetrics
from mmgate.routing.health import BackendHealth
from mmgate.routing.holdings import BackendHoldings, processed_bytes, session_token
from mmgate.routing.peers import Routed
from mmgate.routing.policy import RoutingPolicy
from mmgate.routing.sync import RoutingSync
from mmgate.routing.weights import UNKNOWN_IMAGE_TOKENS, RoutedImage
from mmgate.serving import STOP_WAIT_S, stop_tasks

log = logging.getLogger(__name__)

# What an image another gateway's backend answered is believed to take in that backend's cache.
REMOTE_IMAGE_BYTES = processed_bytes(UNKNOWN_IMAGE_TOKENS)


class Router:
    """Orders the backends for (model, session) and keeps each backend's health and load.

    When every candidate of a model is ejected the router fails open: it routes over all of them
    with the same rule (same session → same backend) instead of refusing with 503, because the
    health view may be stale (the backends may be back before the next probe) and a real attempt
    gives the client the real error (502/504) at worst.
    """

    def __init__(
        self,
        backends: Sequence[Backend],
        settings: GatewaySettings,
        *,
        metrics: GatewayMetrics | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not backends:
            raise ValueError("at least one backend is required")
        names = [b.name for b in backends]
        if len(set(names)) != len(names):
            raise ValueError(f"backend names must be unique (they are hash keys and labels): {names}")
        self.backends = list(backends)
        self._metrics = metrics
        self._health_interval_s = settings.health_interval_s
        self._health_timeout_s = settings.health_timeout_s
        self.holdings = BackendHoldings.for_settings(settings)
        self.policy = RoutingPolicy(settings.routing, self.holdings, rng=rng if rng is not None else random.Random())
        self._clock = clock
        self._health = {
            b.name: BackendHealth(
                eject_after_failures=settings.eject_after_failures, readmit_after_s=settings.readmit_after_s,
            )
            for b in self.backends
        }
        self._outstanding = dict.fromkeys(names, 0)
        self.sync: RoutingSync | None = None
        self._syncer: asyncio.Task[None] | None = None
        self._models: dict[str, list[Backend]] = {}
        self._answered = False
        self._prober: asyncio.Task[None] | None = None
        for backend in self.backends:
            self._publish_health(backend)
            self._publish_outstanding(backend)

    def enable_sync(self, client: Redis, channel: str, *, io_timeout_s: float) -> RoutingSync:
        """Share this gateway's routing with the others on ``channel`` (``mmgate.routing.sync``):
        ``client`` publishes and subscribes. Call before ``start``."""
        self.sync = RoutingSync(
            client, channel, [b.name for b in self.backends], self._outstanding, self._apply_routed,
            on_loads=self._publish_loads, io_timeout_s=io_timeout_s, clock=self._clock, metrics=self._metrics,
        )
        return self.sync

    # Models -----------------------------------------------------------------------------------

    @property
    def models(self) -> list[str]:
        """Every model some backend serves (or served when it last answered), sorted."""
        return sorted(self._models)

    async def refresh_models(self) -> None:
        """Ask every backend which models it serves (unreachable ones keep their last answer)."""
        results = await asyncio.gather(*(b.models() for b in self.backends), return_exceptions=True)
        models: dict[str, list[Backend]] = {}
        previous = {b.name: [m for m, bs in self._models.items() if b in bs] for b in self.backends}
        for backend, result in zip(self.backends, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, MmgateError):
                    raise result
                log.warning("model refresh failed for %s: %s", backend.name, result.message)
                served = previous.get(backend.name, [])
            else:
                self._answered = True
                served = result
            for model in served:
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
        raise ModelNotFoundError(f"The model `{model}` does not exist.", param="model")

    # Choice -----------------------------------------------------------------------------------

    def ranked(self, model: str, session_id: str | None, images: Sequence[RoutedImage] = ()) -> list[Backend]:
        """Every candidate in the order to try them: healthy ones by the policy, then the ejected
        ones by the same policy. The first is the choice, the second the failover. Counts the
        decision's reason (``mmgate_routing_decisions_total``)."""
        candidates = self.candidates(model)
        healthy = [b for b in candidates if self.is_healthy(b)]
        ejected = [b for b in candidates if not self.is_healthy(b)]
        order: list[Backend] = []
        for pool in (healthy, ejected):
            if not pool:
                continue
            decision = self.policy.decide([b.name for b in pool], [self.load(b) for b in pool], session_id, images)
            if not order and self._metrics is not None:
                self._metrics.routing_decisions.labels(decision.reason).inc()
            order.extend(pool[i] for i in decision.order)
        return order

    def record_answered(self, backend: Backend, images: Sequence[RoutedImage], session_id: str | None) -> None:
        """``backend`` answered a request showing ``images`` (the reuse sender recorded that it
        holds them): record who showed them and tell the other gateways."""
        keys = [i.key for i in images]
        token = session_token(session_id)
        self.holdings.show(keys, token)
        if self.sync is not None:
            self.sync.routed(backend.name, token, keys)

    def _apply_routed(self, routed: Routed) -> None:
        """Another gateway's backend answered ``routed``: record it as if this one's had."""
        self.holdings.hold(routed.backend, [(key, REMOTE_IMAGE_BYTES) for key in routed.keys])
        self.holdings.show(routed.keys, routed.token)

    # Load -------------------------------------------------------------------------------------

    def outstanding(self, backend: Backend) -> int:
        """Requests in flight to ``backend`` (between ``begin`` and ``end``)."""
        return self._outstanding[backend.name]

    def load(self, backend: Backend) -> int:
        """Requests in flight to ``backend`` from this gateway and, with the routing sync, from the
        others as they last said."""
        own = self._outstanding[backend.name]
        return own if self.sync is None else own + self.sync.peer_load(backend.name)

    def begin(self, backend: Backend, images: Sequence[RoutedImage] = ()) -> None:
        """One more request in flight to ``backend``, showing ``images``; pair every call with
        ``end``. Counts the image weight ``backend`` is believed to hold (the weight hit ratio)."""
        if self._metrics is not None and images:
            hit = sum(i.weight for i in images if self.holdings.holds(backend.name, i.key))
            self._metrics.routing_image_weight.labels(backend.name, "hit").inc(hit)
            self._metrics.routing_image_weight.labels(backend.name, "miss").inc(sum(i.weight for i in images) - hit)
        self._outstanding[backend.name] += 1
        if self.sync is not None:
            self.sync.changed()
        self._publish_outstanding(backend)

    def end(self, backend: Backend) -> None:
        """One request to ``backend`` finished (its stream included); never goes below zero."""
        self._outstanding[backend.name] = max(0, self._outstanding[backend.name] - 1)
        if self.sync is not None:
            self.sync.changed()
        self._publish_outstanding(backend)

    # Health -----------------------------------------------------------------------------------

    def is_healthy(self, backend: Backend) -> bool:
        return self._health[backend.name].is_healthy

    def report_failure(self, backend: Backend) -> None:
        """A request to ``backend`` failed in a way that says it is down (connect error, timeout)."""
        if self._health[backend.name].record_failure(self._clock()):
            log.warning("backend %s ejected after %d consecutive failure(s)", backend.name,
                        self._health[backend.name].consecutive_failures)
            if self._metrics is not None:
                self._metrics.backend_ejections.labels(backend.name).inc()
            self._publish_health(backend)

    def report_success(self, backend: Backend) -> None:
        """``backend`` answered (any HTTP status): resets its failures, may re-admit it."""
        if self._health[backend.name].record_success(self._clock()):
            log.info("backend %s re-admitted", backend.name)
            # Back from an ejection it may have restarted: believe it holds no image.
            self.holdings.forget_backend(backend.name)
            self._publish_health(backend)

    async def probe_once(self) -> None:
        """One round of active checks: probe every backend concurrently, then refresh the models."""
        results = await asyncio.gather(*(self._probe(b) for b in self.backends))
        for backend, ok in zip(self.backends, results, strict=True):
            if ok:
                self.report_success(backend)
            else:
                self.report_failure(backend)
        await self.refresh_models()

    async def _probe(self, backend: Backend) -> bool:
        try:
            async with asyncio.timeout(self._health_timeout_s):
                return await backend.healthy()
        except (TimeoutError, MmgateError):
            # No answer in time, or a backend error: the probe failed, which is its answer.
            return False
        except Exception:
            # A bug in a backend's probe must not stop the others: count it as failed and say so.
            log.exception("health probe of %s raised", backend.name)
            return False

    async def start(self) -> None:
        """Start the background probe task and the routing sync (idempotent); ``close()`` stops them."""
        if self._prober is None or self._prober.done():
            self._prober = asyncio.create_task(self._probe_loop(), name="mmgate-router-probes")
        if self.sync is not None and (self._syncer is None or self._syncer.done()):
            self._syncer = asyncio.create_task(self.sync.run(), name="mmgate-router-sync")

    async def _probe_loop(self) -> None:
        while True:
            try:
                await self.probe_once()
            except Exception:
                # A failed round must never kill the loop: the next round retries.
                log.exception("health probe round failed")
            await asyncio.sleep(self._health_interval_s)

    async def stop(self) -> None:
        """Stop the probe and sync tasks; the backends stay open."""
        tasks = [t for t in (self._prober, self._syncer) if t is not None]
        self._prober = self._syncer = None
        await stop_tasks(tasks, STOP_WAIT_S)  # bounded: a stuck task must not hold the shutdown

    async def close(self) -> None:
        """Stop probing and close every backend."""
        await self.stop()
        if self.sync is not None:
            await self.sync.close()
        await asyncio.gather(*(b.close() for b in self.backends), return_exceptions=True)

    def _publish_health(self, backend: Backend) -> None:
        if self._metrics is not None:
            self._metrics.backend_healthy.labels(backend.name).set(1 if self.is_healthy(backend) else 0)

    def _publish_loads(self) -> None:
        for backend in self.backends:
            self._publish_outstanding(backend)

    def _publish_outstanding(self, backend: Backend) -> None:
        if self._metrics is not None:
            self._metrics.backend_outstanding.labels(backend.name).set(self._outstanding[backend.name])
            self._metrics.backend_load.labels(backend.name).set(self.load(backend))
