"""The router: the fleet (``fleet``), the choice of a backend among it (``scheduling``, the
profile ``--routing`` names) and, when enabled, the routing sync between gateways (``sync``);
``build_router`` makes one from the gateway's settings.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence

from redis.asyncio import Redis

from mmgate.app_runtime import STOP_WAIT_S, stop_tasks
from mmgate.backends import Backend
from mmgate.config import GatewaySettings
from mmgate.errors import ConfigError
from mmgate.fleet import Fleet
from mmgate.fleet.holdings import processed_bytes, session_token
from mmgate.metrics import GatewayMetrics
from mmgate.routing.scheduling import RoutingPolicy
from mmgate.routing.sync import SECRET_FLAG, Routed, RoutingSync, read_sync_secret, sync_client
from mmgate.routing.weights import UNKNOWN_IMAGE_TOKENS, RoutedImage

# What an image another gateway's backend answered is believed to take in that backend's cache.
REMOTE_IMAGE_BYTES = processed_bytes(UNKNOWN_IMAGE_TOKENS)


class Router(Fleet):
    """Orders the fleet's backends for (model, session, images) by the routing policy; ``start()``
    probes every ``health_interval_s`` and runs the sync, ``close()`` stops both and closes the backends."""

    def __init__(
        self,
        backends: Sequence[Backend],
        settings: GatewaySettings,
        *,
        metrics: GatewayMetrics | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(backends, settings, metrics=metrics, clock=clock)
        self.policy = RoutingPolicy(settings.routing, self.holdings, rng=rng if rng is not None else random.Random())
        self.sync: RoutingSync | None = None
        self._syncer: asyncio.Task[None] | None = None
        self._prober: asyncio.Task[None] | None = None

    def enable_sync(self, client: Redis, channel: str, *, secret: bytes, io_timeout_s: float) -> None:
        """Share this gateway's routing with the others on ``channel`` (``mmgate.routing.sync``),
        signed with ``secret``: ``client`` publishes and subscribes. Call before ``start``."""
        self.sync = RoutingSync(
            client, channel, self._apply_routed,
            secret=secret, io_timeout_s=io_timeout_s, clock=self._clock, metrics=self._metrics)

    def ranked(self, model: str, session_id: str | None, images: Sequence[RoutedImage] = ()) -> list[Backend]:
        """Every candidate in the order to try them (the profile's filters, scorers and picker):
        the first is the choice, the second the failover. Counts the decision's reason and records
        who showed ``images`` (about the clients, so at once: another session's concurrent request
        with the same image sees it shared, not its own new one)."""
        order, reason = self.policy.rank(self, model, session_id, images)
        if reason is not None:
            self._metrics.routing_decision(reason)
        if images:
            self.holdings.show([i.key for i in images], session_token(session_id))
        return order

    def begin(self, backend: Backend, images: Sequence[RoutedImage] = ()) -> None:
        """One more request in flight to ``backend``, showing ``images``; pair every call with
        ``end``. Counts the image weight ``backend`` is believed to hold (the weight hit ratio)."""
        super().begin(backend)
        if images and backend.name in self._current:  # not one that left
            hit = sum(i.weight for i in images if self.holdings.holds(backend.name, i.key))
            self._metrics.routing_image_weight.labels(backend.name, "hit").inc(hit)
            self._metrics.routing_image_weight.labels(backend.name, "miss").inc(sum(i.weight for i in images) - hit)

    def record_answered(self, backend: Backend, images: Sequence[RoutedImage], session_id: str | None) -> None:
        """``backend`` answered a request showing ``images`` (the reuse sender recorded that it
        holds them): tell the other gateways, which record it all (a request without images: nothing)."""
        if self.sync is not None and images:
            self.sync.routed(backend.name, session_token(session_id), [i.key for i in images])

    def _apply_routed(self, routed: Routed) -> None:
        """Another gateway's backend answered ``routed``: record it as if this one's had (a backend
        not in this fleet is dropped: a message cannot grow the record past the fleet)."""
        if routed.backend not in self._current:
            return
        self.holdings.hold(routed.backend, [(key, REMOTE_IMAGE_BYTES) for key in routed.keys])
        self.holdings.show(routed.keys, routed.token)

    async def start(self) -> None:
        """Start the background probe task and the routing sync (idempotent); ``close()`` stops them."""
        if self._prober is None or self._prober.done():
            self._prober = asyncio.create_task(self._probe_loop(), name="mmgate-router-probes")
        if self.sync is not None and (self._syncer is None or self._syncer.done()):
            self._syncer = asyncio.create_task(self.sync.run(), name="mmgate-router-sync")

    async def stop(self) -> None:
        """Stop the probe, sync and membership tasks; the backends stay open, retired ones too."""
        tasks = [t for t in (self._prober, self._syncer, *self._retirements.tasks) if t is not None]
        self._prober = self._syncer = None
        await stop_tasks(tasks, STOP_WAIT_S)  # bounded: a stuck task must not hold the shutdown

    async def close(self) -> None:
        """Stop probing and close every backend, the retired ones still draining too."""
        await self.stop()
        if self.sync is not None:
            await self.sync.close()
        await self.close_backends()


def build_router(
    backends: Sequence[Backend], settings: GatewaySettings, *, metrics: GatewayMetrics | None = None
) -> Router:
    """A router configured by the gateway's settings; no I/O until ``Router.start`` but reading the
    sync's secret. A sync without a Redis or a secret, or a bad ``--routing-sync-url``, raises
    ``ConfigError``."""
    r = settings.routing
    url = r.sync_url or (settings.cache.redis_url if r.sync else None)
    if r.sync and url is None:
        raise ConfigError("--routing-sync", "needs a Redis: --redis-url or --routing-sync-url")
    if url is not None and r.sync_secret_file is None:
        raise ConfigError(SECRET_FLAG, "the routing sync needs a shared secret (whoever can publish on its "
                          "channel could steer the routing otherwise)")
    secret = read_sync_secret(r.sync_secret_file) if url is not None and r.sync_secret_file else b""
    router = Router(backends, settings, metrics=metrics)
    if url is not None:
        router.enable_sync(sync_client(url, settings.cache), r.sync_channel, secret=secret,
                           io_timeout_s=settings.cache.redis_io_timeout_s)
    return router
