"""The gateway's settings: one frozen, validated object built at start-up and passed down explicitly.

Each setting is defined once, here: its flag, its ``MMGATE_*`` variable (``--max-image-bytes`` ↔
``MMGATE_MAX_IMAGE_BYTES``) and its ``--help`` text are generated from the field (see
``mmgate._settings``). A bad value raises ``ConfigError`` naming the flag, which the CLI prints
before exiting with status 2.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Literal

from pydantic import ConfigDict, ValidationInfo, field_validator

from mmgate._settings import Frozen, MiB, setting
from mmgate.config_backends import BackendSpec, dns_server_address
from mmgate.config_routing import RoutingSettings, check_redis_url

# One label of a host name (letters, digits, hyphens inside, underscores tolerated), and a label that
# is a number (decimal, or 0x hex as inet_aton reads it): only an IP address ends in one.
_HOST_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?", re.IGNORECASE)
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*", re.IGNORECASE)

# --help sections of GatewaySettings' own fields (nested models are grouped by their title).
REUSE_GROUP = "reuse and tenants"
HEALTH_GROUP = "backend health"
OBSERVE_GROUP = "observability"

DEFAULT_SESSION_HEADERS: tuple[str, ...] = (
    "x-session-id",
    "x-dynamo-session-id",
    "x-session-affinity",
    "x-correlation-id",
)


class MediaSettings(Frozen):
    """How images are fetched and validated."""

    model_config = ConfigDict(title="image loading")

    max_image_bytes: int = setting(20 * MiB, flag="--max-image-bytes", gt=0,
                                   help="largest encoded image accepted, bytes")
    max_image_pixels: int = setting(40_000_000, flag="--max-image-pixels", gt=0,
                                    help="largest decoded image accepted, pixels")
    max_video_frame_pixels: int = setting(4096 * 4096, flag="--max-video-frame-pixels", advanced=True, gt=0,
                                          help="largest frame a data: video may declare, pixels")
    max_video_seconds: float = setting(3600.0, flag="--max-video-seconds", advanced=True, gt=0,
                                       help="longest data: video accepted, seconds (as its container declares)")
    max_audio_seconds: float = setting(3600.0, flag="--max-audio-seconds", advanced=True, gt=0,
                                       help="longest data: audio accepted, seconds (as its container declares)")
    allowed_formats: tuple[str, ...] = setting(
        ("JPEG", "PNG", "WEBP", "GIF", "BMP"), flag="--allowed-format", advanced=True, metavar="FORMAT",
        help="image format accepted (Pillow's name), repeatable")
    connect_timeout_s: float = setting(3.0, flag="--fetch-connect-timeout", advanced=True, gt=0,
                                       help="seconds to connect to an image origin")
    read_timeout_s: float = setting(10.0, flag="--fetch-read-timeout", advanced=True, gt=0,
                                    help="longest silence of an image origin, seconds")
    total_timeout_s: float = setting(30.0, flag="--fetch-timeout", gt=0,
                                     help="total seconds for one image download (408 past it)")
    max_redirects: int = setting(3, flag="--max-redirects", advanced=True, ge=0, le=10, help="redirects followed per image")
    allowed_private: tuple[str, ...] = setting(
        (), flag="--allowed-private", metavar="HOST|IP|CIDR",
        help="open a private/loopback destination for image URLs (refused by default), repeatable")
    allowed_local_media_path: str | None = setting(
        None, flag="--allowed-local-media-path",
        help="directory file: image URLs may read from (file: is refused without it)")
    max_request_pixels: int = setting(
        160_000_000, flag="--max-request-pixels", advanced=True, gt=0,
        help="most pixels decoded for one request's images (400 past it; cached images are free)")
    large_image_pixels: int = setting(
        4_000_000, flag="--large-image-pixels", advanced=True, gt=0,
        help="images over this many pixels decode in a lane of their own (one thread), apart from the rest")
    max_decode_queue_pixels: int = setting(
        160_000_000, flag="--max-decode-queue-pixels", advanced=True, gt=0,
        help="most pixels of large images queued or decoding at once; a request is admitted with all "
        "its large images or refused (429 with Retry-After) before any is decoded")
    decode_workers: int = setting(2, flag="--decode-workers", advanced=True, ge=1, le=64,
                                  help="processes decoding images (and threads hashing and encoding them)")

    @field_validator("allowed_private")
    @classmethod
    def _check_private(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            if not item or any(c.isspace() for c in item):
                raise ValueError(f"invalid destination {item!r}")
            if "/" in item or ":" in item:
                try:
                    ipaddress.ip_network(item, strict=False)
                except ValueError as exc:
                    raise ValueError(f"{item!r} is not a valid IP address or CIDR ({exc})") from None
                continue
            labels = item.rstrip(".").split(".")
            if _NUMERIC_LABEL.fullmatch(labels[-1]):
                # A name cannot end in a number (RFC 1123): it is meant as an address, so it must be one
                # (999.1.1.1 or 127.1 would otherwise be opened as a host name that never matches).
                try:
                    ipaddress.ip_address(item)
                except ValueError:
                    raise ValueError(f"{item!r} is not a valid IP address (four numbers 0-255, "
                                     "or an IPv6 address, or a CIDR)") from None
            elif not all(_HOST_LABEL.fullmatch(label) for label in labels):
                raise ValueError(f"{item!r} is not a valid host name, IP address or CIDR")
        return value

    @field_validator("allowed_formats")
    @classmethod
    def _check_formats(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from PIL import Image  # here, not at import: only a gateway that builds settings pays for it

        Image.init()
        formats = tuple(v.strip().upper() for v in value)
        unknown = [f for f in formats if f not in Image.OPEN]
        if unknown:
            # A typo (``jpg``) would otherwise refuse every image at run time, as unsupported.
            raise ValueError(f"unknown image format {unknown[0]!r} (Pillow's names: JPEG, PNG, WEBP, GIF, BMP, "
                             "TIFF, …)")
        return formats


class CacheSettings(Frozen):
    """Image cache tiers: local LRU, in-flight dedup, shared Redis / Redis Cluster."""

    model_config = ConfigDict(title="image caches")

    local_cache_bytes: int = setting(512 * MiB, flag="--local-cache-bytes", ge=0,
                                     help="byte budget of the in-process image cache (0 disables it; 128 MiB when the gateway runs "
                                          "embedded engines)")
    local_max_entry_fraction: float = setting(
        0.25, flag="--local-max-entry-fraction", advanced=True, gt=0, le=1,
        help="entries larger than this share of --local-cache-bytes are not cached locally")
    redis_url: str | None = setting(None, flag="--redis-url",
                                    help="shared cache: redis://, rediss:// (TLS) URL; unset: no shared tier")
    redis_cluster: bool = setting(False, flag="--redis-cluster", help="the --redis-url points at a Redis Cluster")
    redis_connect_timeout_s: float = setting(0.5, flag="--redis-connect-timeout", advanced=True, gt=0,
                                             help="seconds to connect to a Redis node")
    redis_io_timeout_s: float = setting(0.5, flag="--redis-io-timeout", advanced=True, gt=0,
                                        help="seconds for one Redis operation")
    fill_wait_s: float = setting(
        1.0, flag="--fill-wait", advanced=True, gt=0, le=60,
        help="seconds a request waits for another gateway's fill of the same image before "
             "fetching it itself (also the fill lease's lifetime)")
    cache_ttl_s: int = setting(3600, flag="--cache-ttl", gt=0, help="shared entry TTL, seconds")
    session_scoping: bool = setting(False, flag="--session-scoping",
                                    help="scope image caches by session id (no session id: caches bypassed)")
    key_prefix: str = setting("mmgate:", flag="--key-prefix", advanced=True, help="prefix of every shared-cache key")

    @field_validator("redis_cluster")
    @classmethod
    def _cluster_needs_url(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("redis_url") is None:  # redis_url is validated first (field order)
            raise ValueError("needs --redis-url (the address of a node of the cluster)")
        return value

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str | None) -> str | None:
        return check_redis_url(value)


class GatewaySettings(Frozen):
    """Everything ``mmgate serve`` needs."""

    host: str = setting("127.0.0.1", flag="--host", group="server", help="address to listen on")
    port: int = setting(8000, flag="--port", group="server", ge=0, le=65535, help="port")
    backends: tuple[BackendSpec, ...] = setting(
        (), flag="--backend", group="server", metavar="KIND=URL",
        help="a backend, repeatable: vllm=http://host:8000 (understands uuids) or openai=https://... "
        "(any OpenAI-compatible server). None: start embedded sim engines (vLLM stand-ins).")
    backend_dns: tuple[BackendSpec, ...] = setting(
        (), flag="--backend-dns", group="server", metavar="KIND=URL",
        help="backends named by a DNS name, repeatable: vllm=http://vllm.ns.svc:8000 (a headless "
        "Service) becomes one backend per A/AAAA record, scheme and port from the URL, re-resolved "
        "every --backend-dns-interval; a failed resolution keeps the last known set")
    backend_dns_interval_s: float = setting(
        10.0, flag="--backend-dns-interval", advanced=True, group="server", ge=0.1, le=3600,
        help="seconds between re-resolutions of the --backend-dns names")
    backend_dns_server: str | None = setting(
        None, flag="--backend-dns-server", advanced=True, group="server", metavar="IP[:PORT]",
        help="the DNS server --backend-dns asks (default: the system's, from /etc/resolv.conf)")
    backend_dns_allowed: tuple[str, ...] = setting(
        (), flag="--backend-dns-allowed", advanced=True, group="server", metavar="IP|CIDR",
        help="open special-purpose addresses (loopback, link-local, unspecified, multicast, broadcast, "
        "reserved) to --backend-dns answers, refused by default; repeatable; cloud metadata never")
    max_backends: int = setting(
        64, flag="--max-backends", advanced=True, group="server", ge=1, le=4096,
        help="most backends at once (static and discovered); a larger DNS answer is cut to it, logged")
    embedded_engines: int = setting(2, flag="--embedded-engines", group="server", ge=1, le=16,
                                    help="sim engines to start when no --backend is given")
    session_headers: tuple[str, ...] = setting(
        DEFAULT_SESSION_HEADERS, flag="--session-header", group="server", metavar="NAME",
        help="session header names, first present wins")
    max_images_per_request: int = setting(64, flag="--max-images-per-request", group="server", ge=1,
                                          help="most images in one request")
    max_uuid_length: int = setting(256, flag="--max-uuid-length", advanced=True, group="server", ge=1,
                                   help="longest image uuid accepted, characters")
    max_body_bytes: int = setting(256 * MiB, flag="--max-body-bytes", group="server", gt=0,
                                  help="largest request body accepted, bytes")
    max_body_bytes_in_flight: int = setting(
        1024 * MiB, flag="--max-body-bytes-in-flight", advanced=True, group="server", gt=0,
        help="request body bytes held at once, all requests together (each costs several times its size "
        "until answered); past it 429 with Retry-After, unless the body is the only one: size it to the "
        "memory limit")
    allow_transfer_params: bool = setting(
        False, flag="--allow-transfer-params", advanced=True, group="http edge",
        help="forward clients' kv_transfer_params and ec_transfer_params (vLLM's disaggregated serving: "
        "they make a replica connect to the host they name and pull cache blocks by id); only when the "
        "clients are a trusted prefill/decode proxy. Off: a 400 naming the field")
    max_json_depth: int = setting(
        64, flag="--max-json-depth", advanced=True, group="http edge", ge=2, le=254,
        help="deepest JSON nesting accepted in a request body (400 past it); at most 254, the "
        "deepest the gateway can write back out for the backend")
    header_timeout_s: float = setting(
        10.0, flag="--header-timeout", group="http edge", gt=0,
        help="seconds a client connection may take to send a request's headers (from connect, or "
        "from its previous request); idle keep-alive connections close after it too")
    body_timeout_s: float = setting(60.0, flag="--body-timeout", group="http edge", gt=0,
                                    help="seconds a client may take to send a whole request body (408 past it)")
    stream_stall_timeout_s: float = setting(
        30.0, flag="--stream-stall-timeout", advanced=True, group="http edge", gt=0,
        help="seconds a streamed answer may wait for its client to read before the stream is cut "
             "(frees the backend connection a client that stopped reading holds)")
    max_tenant_requests: int = setting(
        512, flag="--max-tenant-requests", group=REUSE_GROUP, advanced=True, ge=0,
        help="requests (streams included) one tenant may have in flight, past it 429 with Retry-After; "
             "applies with --api-keys-file (0: no limit)")
    max_inflation_ratio: int = setting(
        0, flag="--max-inflation-ratio", advanced=True, group="http edge", ge=0, le=1000,
        help="accept gzip/deflate request bodies that inflate to at most this many times their size "
             "(and --max-body-bytes); 0 refuses compressed bodies (415)")
    drain_timeout_s: float = setting(30.0, flag="--drain-timeout", group="http edge", ge=0,
                                     help="seconds requests in flight may finish at shutdown before "
                                     "they are cut (a cut stream ends with an SSE error frame)")
    backend_connect_timeout_s: float = setting(5.0, flag="--backend-connect-timeout", advanced=True, group="server", gt=0,
                                               help="seconds to connect to a backend (502 past it)")
    backend_read_timeout_s: float = setting(
        300.0, flag="--backend-read-timeout", group="server", gt=0,
        help="longest backend silence (to headers, and between stream chunks) in seconds (504 past it)")
    backend_reply_timeout_s: float = setting(
        1800.0, flag="--backend-reply-timeout", advanced=True, group="server", gt=0,
        help="seconds a backend may take to answer a whole non-streamed reply, or a stream's head (504 past "
        "it); keep it above the longest non-streamed generation you serve")
    max_backend_reply_bytes: int = setting(
        256 << 20, flag="--max-backend-reply-bytes", advanced=True, group="server", ge=1,
        help="largest non-streamed backend reply body read, in bytes (502 past it)")
    backend_max_connections: int = setting(1024, flag="--backend-max-connections", group="server", ge=1,
                                           help="connection pool size per backend; with API keys one tenant's "
                                           "requests hold at most half of it (429 past that)")
    # Below vLLM's own keep-alive (uvicorn's, VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s): a pooled connection
    # the backend is closing must never be the one a request is written on (a reset: 502).
    backend_keepalive_s: float = setting(
        4.0, flag="--backend-keepalive", advanced=True, group="server", gt=0,
        help="seconds an idle pooled backend connection is kept; keep it below the backend's own "
        "keep-alive (vLLM: 5 s)")
    media: MediaSettings = MediaSettings()
    cache: CacheSettings = CacheSettings()
    routing: RoutingSettings = RoutingSettings()
    reuse: Literal["auto", "off"] = setting(
        "auto", flag="--reuse", group=REUSE_GROUP,
        help="auto: send repeats of an image to a vllm backend as cache-only references "
        "(misses are healed); off: send every image's bytes")
    reuse_backend_cache_gb: float = setting(
        4.0, flag="--reuse-backend-cache-gb", group=REUSE_GROUP, ge=0,
        help="processor-cache size assumed per vllm backend (vLLM's --mm-processor-cache-gb)")
    reuse_tracked_uuids: int = setting(
        65536, flag="--reuse-tracked-uuids", advanced=True, group=REUSE_GROUP, ge=1,
        help="uuids remembered per vllm backend as sent (about 250 bytes of gateway memory each)")
    uuid_store_bytes: int = setting(256 * MiB, flag="--uuid-store-bytes", group=REUSE_GROUP,
                                    ge=0, help="local byte budget of the uuid -> image store used for healing (64 MiB when the "
                                    "gateway runs embedded engines)")
    uuid_ttl_s: int = setting(3600, flag="--uuid-ttl", group=REUSE_GROUP, gt=0,
                              help="uuid store TTL, seconds")
    api_keys_file: str | None = setting(
        None, flag="--api-keys-file", group=REUSE_GROUP,
        help="API keys -> tenants (JSON object or 'KEY TENANT' lines); requests then need a key")
    tenant_secret: str | None = setting(
        None, flag="--tenant-secret", group=REUSE_GROUP, repr=False, min_length=16,
        help="secret (16+ characters) keying the tenant tags of backend uuids (HMAC); prefer the "
        "MMGATE_TENANT_SECRET variable. Unset: random per process, so gateways that share a Redis "
        "must set the same one")
    backend_keys_file: str | None = setting(
        None, flag="--backend-keys-file", group="server",
        help="API keys the gateway sends to its backends: a JSON object or 'BACKEND KEY' lines, BACKEND "
        "a backend's URL as given to --backend (or its name); each key goes to that backend only")
    admin_key_file: str | None = setting(
        None, flag="--admin-key-file", group="server",
        help="file holding the operator's key: with it, requests carrying it (X-Mmgate-Admin-Key, or "
        "Authorization: Bearer) may use "
        "vLLM's operator endpoints (sleep, wake_up, reset caches, LoRA, profiling, ...); unset: refused (403)")
    access_log: Literal["logfmt", "json", "off"] = setting(
        "logfmt", flag="--access-log", group=OBSERVE_GROUP,
        help="one line per request on stderr: logfmt (key=value), json, or off (docs/OPERATIONS.md "
        "lists its fields)")
    otlp_traces_endpoint: str | None = setting(
        None, flag="--otlp-traces-endpoint", group=OBSERVE_GROUP, metavar="URL",
        help="export OpenTelemetry traces over OTLP/HTTP (protobuf) to this URL (as vLLM's flag: "
        "http://collector:4318/v1/traces); needs the 'otel' extra. Unset: no tracing")
    health_interval_s: float = setting(5.0, flag="--health-interval", group=HEALTH_GROUP, gt=0,
                                       help="seconds between backend health probes")
    health_timeout_s: float = setting(2.0, flag="--health-timeout", advanced=True, group=HEALTH_GROUP, gt=0,
                                      help="seconds one health probe may take")
    eject_after_failures: int = setting(1, flag="--eject-after-failures", advanced=True, group=HEALTH_GROUP,
                                        ge=1, help="consecutive connect failures/timeouts that eject a backend")
    readmit_after_s: float = setting(
        5.0, flag="--readmit-after", advanced=True, group=HEALTH_GROUP, ge=0,
        help="minimum seconds an ejected backend stays out before a passing probe re-admits it")

    @field_validator("backends", mode="before")
    @classmethod
    def _parse_backends(cls, value: Any) -> Any:
        if isinstance(value, tuple | list):
            return tuple(BackendSpec.parse(v) if isinstance(v, str) else v for v in value)
        return value

    @field_validator("backend_dns", mode="before")
    @classmethod
    def _parse_backend_dns(cls, value: Any) -> Any:
        if isinstance(value, tuple | list):
            return tuple(BackendSpec.parse(v, flag="--backend-dns") if isinstance(v, str) else v for v in value)
        return value

    @field_validator("backend_dns_allowed")
    @classmethod
    def _check_dns_allowed(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError as exc:
                raise ValueError(f"{item!r} is not an IP address or CIDR ({exc})") from None
        return value

    @field_validator("backend_dns_server")
    @classmethod
    def _check_dns_server(cls, value: str | None) -> str | None:
        if value is not None:
            dns_server_address(value)
        return value

    @field_validator("session_headers")
    @classmethod
    def _lower_headers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(v.strip().lower() for v in value if v.strip())
