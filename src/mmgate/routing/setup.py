"""A ``Router`` built from the gateway's settings, with its routing sync when one is configured,
signed with the secret in ``--routing-sync-secret-file`` (a file, not a flag, so it never shows in
a process list)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mmgate.backends import Backend
from mmgate.config import GatewaySettings
from mmgate.errors import ConfigError
from mmgate.metrics import GatewayMetrics
from mmgate.routing.router import Router
from mmgate.routing.sync.admission import MIN_SECRET_CHARS
from mmgate.routing.sync.channel import sync_client

SECRET_FLAG = "--routing-sync-secret-file"


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


def read_sync_secret(path: str) -> bytes:
    """The sync's secret: the file's text without surrounding whitespace, at least
    ``MIN_SECRET_CHARS`` printable ASCII characters."""
    try:
        secret = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(SECRET_FLAG, f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from exc
    if len(secret) < MIN_SECRET_CHARS or not secret.isascii() or not secret.isprintable():
        raise ConfigError(SECRET_FLAG, f"{path} must hold one secret of at least {MIN_SECRET_CHARS} printable "
                          "ASCII characters")
    return secret.encode()
