"""Start-up before the first backend: while no ``--backend-dns`` name answers an address a backend
may have (a first deploy, every vLLM replica down), the gateway's port answers as a gateway that is
alive and not ready — ``/load`` 200, every other path 503 with ``Retry-After`` — rather than the
gateway exiting: Kubernetes keeps the pod (its liveness and startup probes ask ``/load``) and sends
it no traffic (its readiness probe asks ``/health``). ``--backend-dns-start-timeout`` bounds the
wait (0: no bound); SIGINT or SIGTERM ends it, SIGHUP is ignored. The gateway itself starts once
a name answers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import math
import signal
from urllib.parse import urlsplit

from aiohttp import web

from mmgate._env import env_value
from mmgate._settings import ConfigError
from mmgate.config import GatewaySettings
from mmgate.fleet.discovery import DiscoveryError, DnsResolver
from mmgate.fleet.dns_admission import admitted

log = logging.getLogger(__name__)

START_TIMEOUT_FLAG = "--backend-dns-start-timeout"
DEFAULT_START_TIMEOUT_S = 30.0
# Seconds a client is told to wait before asking a waiting gateway again.
RETRY_AFTER_S = 5


def add_start_timeout_argument(parser: argparse.ArgumentParser, *, show: bool) -> None:
    """``--backend-dns-start-timeout`` (env ``MMGATE_BACKEND_DNS_START_TIMEOUT``), in the help when
    ``show`` (``--help-all``: an advanced flag); default None, so that the variable is read and
    checked by ``start_timeout_s``."""
    parser.add_argument(
        START_TIMEOUT_FLAG, default=None, type=float, metavar="SECONDS",
        help=argparse.SUPPRESS if not show else f"seconds to wait at start-up for a --backend-dns name to answer an address, alive (/load "
             f"200) and not ready (/health 503) meanwhile; past it the gateway exits; 0: wait without "
             f"limit (default {DEFAULT_START_TIMEOUT_S:g}; env MMGATE_BACKEND_DNS_START_TIMEOUT)")


def start_timeout_s(args: argparse.Namespace) -> float:
    """The flag, else its variable, else the default; 0 stands for no limit (``math.inf``)."""
    value: float | None = getattr(args, "backend_dns_start_timeout", None)
    if value is None:
        raw = env_value(START_TIMEOUT_FLAG)
        if raw is None or raw.strip() == "":
            return DEFAULT_START_TIMEOUT_S
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(START_TIMEOUT_FLAG, f"MMGATE_BACKEND_DNS_START_TIMEOUT={raw!r}: not a number") from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError(START_TIMEOUT_FLAG, f"{value:g}: expected 0 (no limit) or a number of seconds")
    return math.inf if value == 0 else value


async def any_backend_address(settings: GatewaySettings, resolver: DnsResolver) -> bool:
    """Whether some ``--backend-dns`` name answers an address that discovery would admit."""
    allowed = [ipaddress.ip_network(a, strict=False) for a in settings.backend_dns_allowed]
    for spec in settings.backend_dns:
        try:
            found = await resolver.addresses(urlsplit(spec.url).hostname or "")
        except DiscoveryError as exc:
            log.info("waiting for a backend: %s", exc)
            continue
        if admitted(found, allowed)[0]:
            return True
    return False


def waiting_app() -> web.Application:
    """Alive, not ready: ``/load`` 200, every other path 503 in OpenAI's error shape."""

    async def load(_: web.Request) -> web.StreamResponse:
        return web.json_response({"server_load": 0})

    async def not_ready(_: web.Request) -> web.StreamResponse:
        error = {"message": "no backend yet: the gateway is waiting for --backend-dns to name one",
                 "type": "service_unavailable", "code": "no_backend"}
        return web.json_response({"error": error}, status=503, headers={"Retry-After": str(RETRY_AFTER_S)})

    app = web.Application()
    app.router.add_get("/load", load)
    app.router.add_route("*", "/{tail:.*}", not_ready)
    return app


async def wait_for_first_backend(settings: GatewaySettings, *, timeout_s: float,
                                 stop: asyncio.Event | None = None) -> bool:
    """Serve the waiting answers on the gateway's address until a ``--backend-dns`` name answers
    (True) or ``stop`` is set, by SIGINT or SIGTERM when not given (False); ``ConfigError`` past
    ``timeout_s`` (``math.inf``: no limit). Returns at once, serving nothing, when a name answers."""
    resolver = DnsResolver(settings.backend_dns_server)
    if await any_backend_address(settings, resolver):
        return True
    loop = asyncio.get_running_loop()
    if stop is None:
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        # SIGHUP's default action ends the process; a reload means nothing before the gateway serves.
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGHUP, log.warning, "SIGHUP while waiting for a backend: ignored "
                                    "(nothing to reload yet)")
    deadline = loop.time() + timeout_s
    runner = web.AppRunner(waiting_app(), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, settings.host, settings.port, reuse_address=True).start()
        log.warning("no backend yet: waiting for %s (%s), alive and not ready on %s:%d",
                    ", ".join(spec.url for spec in settings.backend_dns),
                    "no limit" if math.isinf(timeout_s) else f"{timeout_s:g} s at most", settings.host, settings.port)
        while True:
            with contextlib.suppress(TimeoutError):
                # Asked again every --backend-dns-interval, or sooner when the wait ends first.
                await asyncio.wait_for(stop.wait(), min(settings.backend_dns_interval_s,
                                                        max(0.0, deadline - loop.time())))
            if stop.is_set():
                return False
            if await any_backend_address(settings, resolver):
                return True
            if loop.time() >= deadline:
                raise ConfigError("--backend-dns", f"no backend found in {timeout_s:g} s (no --backend-dns "
                                  f"name resolved to an address; {START_TIMEOUT_FLAG} 0 waits without limit)")
    finally:
        await runner.cleanup()
