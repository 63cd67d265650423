"""``mmgate serve``: flags → ``GatewaySettings`` → a running gateway until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from mmgate.aio import install_uvloop, serve_forever
from mmgate.cli import env_bool, env_default, env_list
from mmgate.config import (
    DEFAULT_SESSION_HEADERS,
    BackendSpec,
    CacheSettings,
    GatewaySettings,
    MediaSettings,
    build,
)

log = logging.getLogger("mmgate")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The gateway's flags (each also read from MMGATE_<FLAG>)."""
    e = env_default
    g = parser.add_argument_group("server")
    g.add_argument("--host", default=e("--host", "127.0.0.1"), help="address to listen on (default %(default)s)")
    g.add_argument("--port", type=int, default=int(e("--port", 8000)), help="port (default %(default)s)")
    g.add_argument(
        "--backend", action="append", default=None, metavar="KIND=URL",
        help="a backend, repeatable: vllm=http://host:8000 (understands uuids) or openai=https://... "
        "(any OpenAI-compatible server). None: start embedded sim engines (vLLM stand-ins).",
    )
    g.add_argument("--embedded-engines", type=int, default=int(e("--embedded-engines", 2)),
                   help="sim engines to start when no --backend is given (default %(default)s)")
    g.add_argument("--session-header", action="append", default=None, metavar="NAME",
                   help="session header names, first present wins (default: {})".format(", ".join(DEFAULT_SESSION_HEADERS)))
    g.add_argument("--max-images-per-request", type=int, default=int(e("--max-images-per-request", 64)))
    g.add_argument("--backend-connect-timeout", type=float, default=float(e("--backend-connect-timeout", 5.0)),
                   help="seconds to connect to a backend (502 past it)")
    g.add_argument("--backend-read-timeout", type=float, default=float(e("--backend-read-timeout", 300.0)),
                   help="longest backend silence in seconds (504 past it)")
    g.add_argument("--log-level", default=e("--log-level", "info"), choices=["debug", "info", "warning", "error"])

    m = parser.add_argument_group("image loading")
    m.add_argument("--max-image-bytes", type=int, default=int(e("--max-image-bytes", 20 * 1024 * 1024)))
    m.add_argument("--max-image-pixels", type=int, default=int(e("--max-image-pixels", 40_000_000)))
    m.add_argument("--allowed-private", action="append", default=None, metavar="HOST|IP|CIDR",
                   help="open a private/loopback destination for image URLs (refused by default), repeatable")
    m.add_argument("--allowed-local-media-path", default=e("--allowed-local-media-path", None),
                   help="directory file: image URLs may read from (file: is refused without it)")
    m.add_argument("--fetch-connect-timeout", type=float, default=float(e("--fetch-connect-timeout", 3.0)))
    m.add_argument("--fetch-read-timeout", type=float, default=float(e("--fetch-read-timeout", 10.0)))
    m.add_argument("--fetch-timeout", type=float, default=float(e("--fetch-timeout", 30.0)),
                   help="total seconds for one image download (408 past it)")
    m.add_argument("--max-redirects", type=int, default=int(e("--max-redirects", 3)))

    c = parser.add_argument_group("image caches")
    c.add_argument("--local-cache-bytes", type=int, default=int(e("--local-cache-bytes", 512 * 1024 * 1024)),
                   help="byte budget of the in-process image cache (0 disables it)")
    c.add_argument("--redis-url", default=e("--redis-url", None),
                   help="shared cache: redis://, rediss:// (TLS) URL; unset: no shared tier")
    c.add_argument("--redis-cluster", action="store_true", default=env_bool("--redis-cluster"),
                   help="the --redis-url points at a Redis Cluster")
    c.add_argument("--redis-connect-timeout", type=float, default=float(e("--redis-connect-timeout", 0.5)))
    c.add_argument("--redis-io-timeout", type=float, default=float(e("--redis-io-timeout", 0.5)))
    c.add_argument("--cache-ttl", type=int, default=int(e("--cache-ttl", 3600)), help="shared entry TTL, seconds")
    c.add_argument("--session-scoping", action="store_true", default=env_bool("--session-scoping"),
                   help="scope image caches by session id (no session id: caches bypassed)")

    r = parser.add_argument_group("routing, reuse and tenants")
    r.add_argument("--reuse", choices=["auto", "off"], default=e("--reuse", "auto"),
                   help="auto: send repeats of an image to a vllm backend as cache-only references "
                   "(misses are healed); off: send every image's bytes (default %(default)s)")
    r.add_argument("--reuse-backend-cache-gb", type=float, default=float(e("--reuse-backend-cache-gb", 4.0)),
                   help="processor-cache size assumed per vllm backend (vLLM's --mm-processor-cache-gb)")
    r.add_argument("--uuid-store-bytes", type=int, default=int(e("--uuid-store-bytes", 256 * 1024 * 1024)),
                   help="local byte budget of the uuid -> image store used for healing")
    r.add_argument("--uuid-ttl", type=int, default=int(e("--uuid-ttl", 3600)), help="uuid store TTL, seconds")
    r.add_argument("--api-keys-file", default=e("--api-keys-file", None),
                   help="API keys -> tenants (JSON object or 'KEY TENANT' lines); requests then need a key")
    r.add_argument("--health-interval", type=float, default=float(e("--health-interval", 5.0)),
                   help="seconds between backend health probes")
    r.add_argument("--eject-after-failures", type=int, default=int(e("--eject-after-failures", 1)),
                   help="consecutive connect failures/timeouts that eject a backend")
    r.add_argument("--readmit-after", type=float, default=float(e("--readmit-after", 5.0)),
                   help="minimum seconds an ejected backend stays out before a passing probe re-admits it")

    s = parser.add_argument_group("embedded engines")
    s.add_argument("--sim-speedup", type=float, default=float(e("--sim-speedup", 1.0)),
                   help="divide the embedded engines' modelled latency by this")
    s.add_argument("--sim-mm-processor-cache-gb", type=float, default=float(e("--sim-mm-processor-cache-gb", 4.0)))


def settings_from_args(args: argparse.Namespace) -> GatewaySettings:
    """Validated settings; a bad value raises ConfigError naming the flag."""
    backends = tuple(BackendSpec.parse(b) for b in (args.backend or env_list("--backend")))
    media = build(
        MediaSettings,
        max_image_bytes=args.max_image_bytes,
        max_image_pixels=args.max_image_pixels,
        allowed_private=tuple(args.allowed_private or env_list("--allowed-private")),
        allowed_local_media_path=args.allowed_local_media_path,
        connect_timeout_s=args.fetch_connect_timeout,
        read_timeout_s=args.fetch_read_timeout,
        total_timeout_s=args.fetch_timeout,
        max_redirects=args.max_redirects,
        setting_names={
            "connect_timeout_s": "--fetch-connect-timeout", "read_timeout_s": "--fetch-read-timeout",
            "total_timeout_s": "--fetch-timeout",
        },
    )
    cache = build(
        CacheSettings,
        local_cache_bytes=args.local_cache_bytes,
        redis_url=args.redis_url,
        redis_cluster=args.redis_cluster,
        redis_connect_timeout_s=args.redis_connect_timeout,
        redis_io_timeout_s=args.redis_io_timeout,
        cache_ttl_s=args.cache_ttl,
        session_scoping=args.session_scoping,
        setting_names={
            "redis_connect_timeout_s": "--redis-connect-timeout", "redis_io_timeout_s": "--redis-io-timeout",
            "cache_ttl_s": "--cache-ttl",
        },
    )
    headers = tuple(args.session_header or env_list("--session-header") or DEFAULT_SESSION_HEADERS)
    settings = build(
        GatewaySettings,
        host=args.host,
        port=args.port,
        backends=backends,
        media=media,
        cache=cache,
        session_headers=headers,
        max_images_per_request=args.max_images_per_request,
        backend_connect_timeout_s=args.backend_connect_timeout,
        backend_read_timeout_s=args.backend_read_timeout,
        embedded_engines=args.embedded_engines,
        reuse=args.reuse,
        reuse_backend_cache_gb=args.reuse_backend_cache_gb,
        uuid_store_bytes=args.uuid_store_bytes,
        uuid_ttl_s=args.uuid_ttl,
        api_keys_file=args.api_keys_file,
        health_interval_s=args.health_interval,
        eject_after_failures=args.eject_after_failures,
        readmit_after_s=args.readmit_after,
        setting_names={
            "uuid_ttl_s": "--uuid-ttl", "health_interval_s": "--health-interval",
            "readmit_after_s": "--readmit-after",
            "backend_connect_timeout_s": "--backend-connect-timeout",
            "backend_read_timeout_s": "--backend-read-timeout",
        },
    )
    assert isinstance(settings, GatewaySettings)
    return settings


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted."""
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings_from_args(args)
    sim_settings = None
    if not settings.backends:
        from mmgate.sim.config import SimSettings

        sim_settings = build(
            SimSettings, speedup=args.sim_speedup, mm_processor_cache_gb=args.sim_mm_processor_cache_gb,
            setting_names={"speedup": "--sim-speedup", "mm_processor_cache_gb": "--sim-mm-processor-cache-gb"},
        )
    install_uvloop()

    async def start() -> object:
        from mmgate.api.app import start_gateway

        running = await start_gateway(settings, sim_settings=sim_settings)
        backends = ", ".join(f"{b.name}={b.url}" for b in running.gateway.router.backends)
        log.info("mmgate gateway on %s (backends: %s; models: %s)", running.url, backends,
                 ", ".join(running.gateway.router.models) or "none yet")
        return running.stop

    try:
        asyncio.run(serve_forever(start))  # type: ignore[arg-type]
    except OSError as exc:  # the port is taken, the address is not ours: say so, no traceback
        print(f"mmgate serve: cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    return 0
