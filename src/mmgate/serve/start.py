"""The composition root of ``mmgate serve``: ``start_gateway(settings)`` builds everything from
settings — the shared tier, the media loader, the backends (embedded ``sim`` engines when none is
configured), the router, the UUID store, tenants — wires them into a ``Gateway`` and serves it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CollectorRegistry

from mmgate.api import Gateway, build_app
from mmgate.api.edge import raise_fd_limit
from mmgate.app_runtime import bound_port, server_logger
from mmgate.backends import Backend, HTTPBackend
from mmgate.config import GatewaySettings
from mmgate.errors import ConfigError
from mmgate.fleet.discovery import (
    BackendDiscovery,
    DiscoveryError,
    DnsResolver,
    MakeBackend,
    Wanted,
    first_backends,
)
from mmgate.media import MediaLoader
from mmgate.metrics import GatewayMetrics
from mmgate.observe.middleware import OBSERVER_KEY, refusal_log
from mmgate.reuse import KeySpace, UUIDStore
from mmgate.reuse.videos import VideoURLs
from mmgate.routing import build_router
from mmgate.serve.engines import embedded_defaults, start_embedded_engines
from mmgate.serve.secrets import read_admin_key, read_backend_keys, read_tenant_keys
from mmgate.sim import SimSettings
from mmgate.store import build_shared_tier

log = logging.getLogger(__name__)
# Seconds a request cut at shutdown gets to write its last SSE frame.
CUT_GRACE_S = 2.0
# Seconds start-up waits for a --backend-dns name to resolve (replicas may start with the gateway).
DISCOVERY_START_S = 30.0
# Connections the kernel queues for accept() (aiohttp's default is 128: a burst of new clients
# would meet SYN retries of a second or more).
LISTEN_BACKLOG = 1024


@dataclass
class RunningGateway:
    """A gateway serving on ``url``; ``stop()`` shuts it and its embedded engines down."""

    gateway: Gateway
    runner: web.AppRunner
    port: int
    host: str
    discovery: BackendDiscovery
    embedded: bool = False
    backend_keys: dict[str, str] = field(default_factory=dict, repr=False)
    _cleanups: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        """Stop accepting, let requests in flight finish for ``--drain-timeout``, cut the rest
        (streams end with an SSE error frame), then close everything."""
        gateway = self.gateway
        gateway.stopping = True
        for site in list(self.runner.sites):
            await site.stop()  # no new connections
        if self.runner.server is not None:
            self.runner.server.pre_shutdown()  # idle connections close; busy ones after their answer
        inflight = set(gateway.inflight)
        if inflight:
            _, cut = await asyncio.wait(inflight, timeout=gateway.settings.drain_timeout_s)
            for task in cut:
                task.cancel()  # its handler ends a started stream with an SSE error frame
            if cut:
                await asyncio.wait(cut, timeout=CUT_GRACE_S)
        await self.runner.cleanup()
        await self.discovery.close()  # no new backend set for a router that is closing
        await self.gateway.close()
        for cleanup in self._cleanups:
            with contextlib.suppress(Exception):
                await cleanup()


async def start_gateway(
    settings: GatewaySettings, *, sim_settings: SimSettings | None = None
) -> RunningGateway:
    """Build and start a gateway from settings (embedded sim engines when no backend is set).

    Everything that can reject a setting (API keys file, Redis URL) is checked before anything
    starts; a failure part-way through stops what was started. With embedded engines, the caches'
    budgets not set explicitly are laptop-sized (``embedded_defaults``).
    """
    embedded = not settings.backends and not settings.backend_dns
    if embedded:
        settings = embedded_defaults(settings)
    tenants = read_tenant_keys(settings.api_keys_file) if settings.api_keys_file else None
    if tenants is None:
        log.warning("no --api-keys-file: authentication is off, every client is served without a key")
    backend_keys = read_backend_keys(settings.backend_keys_file, [*settings.backends, *settings.backend_dns]
                                     ) if settings.backend_keys_file else {}
    admin_key = read_admin_key(settings.admin_key_file) if settings.admin_key_file else None
    registry = CollectorRegistry()
    shared = build_shared_tier(settings.cache, settings.media, registry)
    cleanups: list[Callable[[], Awaitable[None]]] = []
    if shared is not None:
        cleanups.append(shared.close)
    gateway: Gateway | None = None
    try:
        specs = list(settings.backends)
        if embedded:
            first_port = settings.port + 1 if 0 < settings.port < 65535 - settings.embedded_engines else 0
            specs, stop_engines = await start_embedded_engines(
                settings.embedded_engines, sim_settings, first_port=first_port
            )
            cleanups.insert(0, stop_engines)
        discovery = BackendDiscovery(
            specs, settings.backend_dns, backend_factory(settings, backend_keys),
            resolver=DnsResolver(settings.backend_dns_server) if settings.backend_dns else None,
            interval_s=settings.backend_dns_interval_s, max_backends=settings.max_backends,
            allowed=[ipaddress.ip_network(a, strict=False) for a in settings.backend_dns_allowed], registry=registry)
        cleanups.insert(0, discovery.close)
        try:
            backends = await first_backends(discovery, timeout_s=DISCOVERY_START_S)
        except DiscoveryError as exc:
            raise ConfigError("--backend-dns", str(exc)) from exc
        metrics = GatewayMetrics(registry)
        loader = MediaLoader(settings.media, settings.cache, registry=registry, shared=shared)
        router = build_router(backends, settings, metrics=metrics)
        discovery.on_change(router.set_backends, settle=router.refresh_models)
        store = UUIDStore(settings.uuid_store_bytes, settings.uuid_ttl_s, shared)
        if tenants is not None and shared is not None and not settings.tenant_secret:
            log.warning("tenants and a shared Redis without --tenant-secret: this gateway's uuid keys "
                        "differ from every other gateway's (set the same MMGATE_TENANT_SECRET on all)")
        keys = KeySpace(settings.tenant_secret.encode() if settings.tenant_secret else None)
        gateway = Gateway(settings, loader=loader, router=router, metrics=metrics, store=store,
                          tenants=tenants, keys=keys, video_urls=VideoURLs(shared=shared))
        await router.refresh_models()
        await router.start()
        await discovery.start()
        if shared is not None:
            await shared.start()  # a cluster's slot map, learnt once before the first request
        await loader.start()  # the decode processes: the first image is served at full speed
        runner, port = await _serve(gateway, settings, admin_key)
    except BaseException:
        if gateway is not None:
            await gateway.close()
        for cleanup in cleanups:
            with contextlib.suppress(Exception):
                await cleanup()
        raise
    return RunningGateway(gateway=gateway, runner=runner, port=port, host=settings.host, discovery=discovery,
                          embedded=embedded, backend_keys=backend_keys, _cleanups=cleanups)


def backend_factory(settings: GatewaySettings, backend_keys: dict[str, str]) -> MakeBackend:
    """Builds each backend of the set with the settings' timeouts and pool, and the key the keys
    file gives its configured URL (a discovered backend: its ``--backend-dns`` URL's)."""

    def make(wanted: Wanted) -> Backend:
        return HTTPBackend(
            wanted.name, wanted.kind, wanted.url,
            connect_timeout_s=settings.backend_connect_timeout_s,
            read_timeout_s=settings.backend_read_timeout_s,
            max_connections=settings.backend_max_connections,
            keepalive_s=settings.backend_keepalive_s,
            reply_timeout_s=settings.backend_reply_timeout_s,
            max_reply_bytes=settings.max_backend_reply_bytes,
            api_key=backend_keys.get(wanted.configured_url),
        )

    return make


async def _serve(gateway: Gateway, settings: GatewaySettings, admin_key: str | None) -> tuple[web.AppRunner, int]:
    """Serve ``gateway`` on aiohttp's server: header deadline, drain time, open-files limit."""
    # handler_cancellation: a client that goes away cancels its handler, so the gateway closes the
    # backend stream and an engine stops generating for nobody (aiohttp's default is off).
    # keepalive_timeout also bounds the wait for a new connection's first request headers.
    # auto_decompress off: a compressed body is refused or inflated by ``read_body``, in a thread
    # and under its limits, never by aiohttp on the event loop.
    # The access log is the observer's middleware's; aiohttp's hook only writes the lines of the
    # requests its own parser refused before any middleware ran (``refusal_log``).
    app = build_app(gateway, admin_key=admin_key)
    runner = web.AppRunner(
        app, access_log=logging.getLogger("aiohttp.access"), access_log_class=refusal_log(app[OBSERVER_KEY]),
        handle_signals=False, handler_cancellation=True, auto_decompress=False,
        shutdown_timeout=CUT_GRACE_S, keepalive_timeout=settings.header_timeout_s, logger=server_logger(),
    )
    await runner.setup()
    raise_fd_limit()
    site = web.TCPSite(runner, settings.host, settings.port, backlog=LISTEN_BACKLOG, reuse_address=True)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, bound_port(runner)
