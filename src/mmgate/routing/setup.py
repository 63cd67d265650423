"""A ``Router`` built from the gateway's settings, with its routing sync when one is configured."""

from __future__ import annotations

from collections.abc import Sequence

from mmgate.backends import Backend
from mmgate.config import GatewaySettings
from mmgate.errors import ConfigError
from mmgate.metrics import GatewayMetrics
from mmgate.routing.router import Router
from mmgate.routing.sync import SECRET_FLAG, read_sync_secret, sync_client


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
