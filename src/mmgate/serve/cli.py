"""``mmgate serve``: flags → ``GatewaySettings`` → a running gateway until SIGINT/SIGTERM.

The flags are generated from the settings models (``mmgate.config``, and the two ``SimSettings``
fields the embedded engines take as ``--sim-*``): each is defined once, there.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from mmgate._env import env_value
from mmgate._settings import (
    ConfigError,
    Flag,
    add_flags,
    from_args,
    merged,
    validate,
    values_from_args,
    values_from_file,
)
from mmgate.app_runtime import install_uvloop, serve_forever
from mmgate.config import GatewaySettings
from mmgate.heap import keep_request_buffers
from mmgate.serve.first_backend import add_start_timeout_argument, start_timeout_s, wait_for_first_backend
from mmgate.sim import SimSettings

if TYPE_CHECKING:
    from mmgate.serve.start import RunningGateway

log = logging.getLogger("mmgate")
LOG_LEVELS = ("debug", "info", "warning", "error")
# The embedded engines' settings a gateway user may change, as --sim-<flag>.
SIM_PREFIX = "--sim-"
SIM_FIELDS = ("speedup", "mm_processor_cache_gb", "responses_store_bytes")


HELP_ALL = "--help-all"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The gateway's flags (each also read from MMGATE_<FLAG>); ``--help`` lists what an operator
    decides, ``--help-all`` every flag."""
    show_all = HELP_ALL in sys.argv[1:]
    parser.epilog = ("Every flag also reads MMGATE_<FLAG> from the environment, and every setting can come "
                     "from a TOML file (--config). " + ("" if show_all else
                     "Advanced flags (internal bounds, timeouts, health and cache tuning) work too: --help-all lists them."))
    parser.add_argument(HELP_ALL, action="help", help="show every flag, the advanced ones too, and exit")
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="TOML file of settings, below flags and MMGATE_* variables: a flag's name without its "
                             "dashes, or a field of a settings table (docs/CONFIG.md) (env MMGATE_CONFIG)")
    flags = add_flags(parser, GatewaySettings, show_advanced=show_all)
    # default None: MMGATE_LOG_LEVEL is checked in ``run`` (argparse never checks a default).
    parser.add_argument("--log-level", default=None, choices=LOG_LEVELS,
                        help="log level (default info; env MMGATE_LOG_LEVEL)")
    add_start_timeout_argument(parser, show=show_all)
    sim_group = parser.add_argument_group("embedded engines")
    sim_flags = add_flags(sim_group, SimSettings, prefix=SIM_PREFIX, only=SIM_FIELDS)
    parser.set_defaults(_serve_flags=flags, _sim_flags=sim_flags)


def settings_from_args(args: argparse.Namespace) -> GatewaySettings:
    """Validated settings; a bad value raises ConfigError naming the flag."""
    flags: list[Flag] = args._serve_flags
    config = _config_file(args)
    if not config:
        return from_args(args, GatewaySettings, flags)
    sim_keys = frozenset(f.flag.removeprefix("--") for f in args._sim_flags)
    return validate(GatewaySettings, merged(values_from_file(config, GatewaySettings, flags, others=sim_keys),
                                            values_from_args(args, flags)))


def _config_file(args: argparse.Namespace) -> str | None:
    return str(args.config) if args.config is not None else env_value("--config")


def sim_settings_from_args(args: argparse.Namespace) -> SimSettings:
    """The embedded engines' settings (``--sim-*``); a bad value raises ConfigError naming the flag."""
    flags: list[Flag] = args._sim_flags
    config = _config_file(args)
    if not config:
        return from_args(args, SimSettings, flags, prefix=SIM_PREFIX)
    return validate(SimSettings, merged(values_from_file(config, SimSettings, flags, others=None),
                                        values_from_args(args, flags)), prefix=SIM_PREFIX)


def log_level(args: argparse.Namespace) -> str:
    """``--log-level``, else ``MMGATE_LOG_LEVEL``, else info; a bad variable raises ConfigError."""
    if args.log_level is not None:
        return str(args.log_level)
    raw = env_value("--log-level")
    if raw is None or raw.strip() == "":
        return "info"
    if raw.strip().lower() not in LOG_LEVELS:
        raise ConfigError("--log-level", f"MMGATE_LOG_LEVEL={raw!r}: expected one of {', '.join(LOG_LEVELS)}")
    return raw.strip().lower()


def _reload_on_sighup(running: RunningGateway, args: argparse.Namespace) -> None:
    """SIGHUP re-reads the settings as start-up read them and applies what can change
    (``mmgate.serve.reload``)."""
    from mmgate.serve.reload import Reloader

    reloader = Reloader(running, lambda: settings_from_args(args))
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reloader.schedule)


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted."""
    logging.basicConfig(level=log_level(args).upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings_from_args(args)
    wait_s = start_timeout_s(args)
    sim_settings = sim_settings_from_args(args) if not settings.backends else None
    install_uvloop()
    keep_request_buffers()
    try:
        # Discovered backends only: alive and not ready until a name answers (mmgate.serve.first_backend).
        if settings.backend_dns and not settings.backends and not asyncio.run(
                wait_for_first_backend(settings, timeout_s=wait_s)):
            return 0  # SIGINT or SIGTERM while waiting
    except OSError as exc:
        print(f"mmgate serve: cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1

    async def start() -> Callable[[], Awaitable[None]]:
        from mmgate.serve.start import start_gateway

        running = await start_gateway(settings, sim_settings=sim_settings)
        _reload_on_sighup(running, args)
        backends = ", ".join(f"{b.name}={b.url}" for b in running.gateway.router.backends)
        log.info("mmgate gateway on %s (backends: %s; models: %s)", running.url, backends,
                 ", ".join(running.gateway.router.models) or "none yet")
        return running.stop

    try:
        asyncio.run(serve_forever(start))
    except OSError as exc:  # the port is taken, the address is not ours: say so, no traceback
        print(f"mmgate serve: cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    return 0
