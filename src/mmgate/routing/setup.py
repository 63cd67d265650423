"""A ``Router`` built from the gateway's settings: its policy, its load poll, its routing sync."""

from __future__ import annotations

from collections.abc import Sequence

from mmgate.backends import Backend
from mmgate.config import GatewaySettings
from mmgate.errors import ConfigError
from mmgate.metrics import GatewayMetrics
from mmgate.routing.history import ImageHistory
from mmgate.routing.policy import RoutingPolicy
from mmgate.routing.popularity import ImagePopularity
from mmgate.routing.router import Router
from mmgate.routing.sync import sync_client


def build_router(
    backends: Sequence[Backend], settings: GatewaySettings, *, metrics: GatewayMetrics | None = None
) -> Router:
    """A router configured by the gateway's settings (``health_*``, ``eject_*``, ``readmit_*``,
    ``routing``); no I/O until ``Router.start``. A bad ``--routing-sync-url`` raises ``ConfigError``."""
    r = settings.routing
    popularity = ImagePopularity(
        r.replicate_share, half_life=r.popularity_half_life, max_keys=r.history_keys,
    ) if r.mode == "image-affinity" and r.replicate_share > 0 else None
    policy = RoutingPolicy(
        r.mode, load_factor=r.load_factor, session_weight=r.session_weight, held_weight=r.held_weight,
        history=ImageHistory(r.history_keys), hold_overflow=r.hold_overflow, popularity=popularity,
        held_balance=r.held_balance, load_rounding=r.load_rounding,
    )
    router = Router(
        backends,
        metrics=metrics,
        health_interval_s=settings.health_interval_s,
        health_timeout_s=settings.health_timeout_s,
        eject_after_failures=settings.eject_after_failures,
        readmit_after_s=settings.readmit_after_s,
        policy=policy,
        load_poll_interval_s=r.load_poll_interval_s,
        load_poll_timeout_s=r.load_poll_timeout_s,
    )
    url = r.sync_url or (settings.cache.redis_url if r.sync else None)
    if r.sync and url is None:
        raise ConfigError("--routing-sync", "needs a Redis: --redis-url or --routing-sync-url")
    if url is not None:
        router.enable_sync(
            sync_client(url, settings.cache), r.sync_channel,
            interval_s=r.sync_interval_s, max_age_s=r.sync_max_age_s,
            io_timeout_s=settings.cache.redis_io_timeout_s,
        )
    return router
