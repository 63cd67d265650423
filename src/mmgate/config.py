"""Settings: one frozen, validated object built at start-up and passed down explicitly.

Every CLI flag has an ``MMGATE_*`` environment equivalent (``--max-image-bytes`` ↔
``MMGATE_MAX_IMAGE_BYTES``); see ``mmgate.cli``. A bad value raises ``ConfigError`` naming the
setting, which the CLI prints before exiting with status 2.
"""

from __future__ import annotations

import ipaddress
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from mmgate.errors import ConfigError

MiB = 1024 * 1024
GiB = 1024 * MiB

DEFAULT_SESSION_HEADERS: tuple[str, ...] = (
    "x-session-id",
    "x-dynamo-session-id",
    "x-session-affinity",
    "x-correlation-id",
)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class MediaSettings(_Frozen):
    """How images are fetched and validated."""

    max_image_bytes: int = Field(20 * MiB, gt=0)
    max_image_pixels: int = Field(40_000_000, gt=0)
    allowed_formats: tuple[str, ...] = ("JPEG", "PNG", "WEBP", "GIF", "BMP")
    connect_timeout_s: float = Field(3.0, gt=0)
    read_timeout_s: float = Field(10.0, gt=0)
    total_timeout_s: float = Field(30.0, gt=0)
    max_redirects: int = Field(3, ge=0, le=10)
    # Private/loopback destinations opened explicitly: IPs, CIDRs or host names.
    allowed_private: tuple[str, ...] = ()
    # Root directory for file: URLs (like vLLM's --allowed-local-media-path); None: file: refused.
    allowed_local_media_path: str | None = None
    decode_workers: int = Field(2, ge=1, le=64)

    @field_validator("allowed_private")
    @classmethod
    def _check_private(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            if not item or any(c.isspace() for c in item):
                raise ValueError(f"invalid destination {item!r}")
            if "/" in item:
                ipaddress.ip_network(item, strict=False)  # ValueError names the bad CIDR
        return value

    @field_validator("allowed_formats")
    @classmethod
    def _upper_formats(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(v.upper() for v in value)


class CacheSettings(_Frozen):
    """Image cache tiers: local LRU, in-flight dedup, shared Redis / Redis Cluster."""

    local_cache_bytes: int = Field(512 * MiB, ge=0)
    # Entries larger than this share of local_cache_bytes are not cached locally.
    local_max_entry_fraction: float = Field(0.25, gt=0, le=1)
    redis_url: str | None = None
    redis_cluster: bool = False
    redis_connect_timeout_s: float = Field(0.5, gt=0)
    redis_io_timeout_s: float = Field(0.5, gt=0)
    cache_ttl_s: int = Field(3600, gt=0)
    session_scoping: bool = False
    key_prefix: str = "mmgate:"

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        scheme = urlsplit(value).scheme
        if scheme not in ("redis", "rediss", "unix"):
            # Never echo the URL: it may carry a password.
            raise ValueError(f"scheme must be redis://, rediss:// or unix://, got {scheme or 'none'}://")
        return value


class BackendSpec(_Frozen):
    """One backend: ``--backend KIND=URL`` on the command line."""

    kind: Literal["vllm", "openai"]
    url: str
    name: str = ""

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"backend URL must be http(s)://host[:port], got {value!r}")
        return value.rstrip("/")

    @classmethod
    def parse(cls, text: str) -> BackendSpec:
        """Parse ``KIND=URL`` (``vllm=http://10.0.0.5:8000``)."""
        kind, sep, url = text.partition("=")
        if not sep:
            raise ConfigError("--backend", f"expected KIND=URL (kind vllm or openai), got {text!r}")
        try:
            return cls(kind=kind.strip().lower(), url=url.strip())
        except ValidationError as exc:
            raise ConfigError("--backend", _first_error(exc)) from exc


class GatewaySettings(_Frozen):
    """Everything ``mmgate serve`` needs."""

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    backends: tuple[BackendSpec, ...] = ()
    media: MediaSettings = MediaSettings()
    cache: CacheSettings = CacheSettings()
    session_headers: tuple[str, ...] = DEFAULT_SESSION_HEADERS
    max_images_per_request: int = Field(64, ge=1)
    max_uuid_length: int = Field(256, ge=1)
    max_body_bytes: int = Field(256 * MiB, gt=0)
    backend_connect_timeout_s: float = Field(5.0, gt=0)
    # Longest silence tolerated from a backend (time to headers, and between stream chunks).
    backend_read_timeout_s: float = Field(300.0, gt=0)
    backend_max_connections: int = Field(1024, ge=1)
    # Number of embedded sim engines started when no --backend is given.
    embedded_engines: int = Field(2, ge=1, le=16)
    # Gateway-managed reuse: repeats sent to a vllm backend as cache-only references.
    reuse: Literal["auto", "off"] = "auto"
    # What the gateway assumes each vllm backend's processor cache holds (vLLM's default: 4 GiB).
    reuse_backend_cache_gb: float = Field(4.0, ge=0)
    # UUID store (uuid -> bytes, for healing and openai backends): local bytes and TTL.
    uuid_store_bytes: int = Field(256 * MiB, ge=0)
    uuid_ttl_s: int = Field(3600, gt=0)
    # API keys -> tenants (file: JSON object or 'KEY TENANT' lines); None: no tenants, no auth.
    api_keys_file: str | None = None
    # Routing: active probe period and per-probe timeout, passive ejection, minimum time out.
    health_interval_s: float = Field(5.0, gt=0)
    health_timeout_s: float = Field(2.0, gt=0)
    eject_after_failures: int = Field(1, ge=1)
    readmit_after_s: float = Field(5.0, ge=0)

    @field_validator("session_headers")
    @classmethod
    def _lower_headers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(v.strip().lower() for v in value if v.strip())


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    return str(err.get("msg", exc))


def build(model_cls: type[_Frozen], setting_names: dict[str, str] | None = None, **values: object) -> _Frozen:
    """Build a settings model, turning a validation error into ``ConfigError`` naming the setting.

    ``setting_names`` maps a field name to the flag the user typed (``max_image_bytes`` →
    ``--max-image-bytes``) so the message names what the user can change.
    """
    try:
        return model_cls(**values)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ()))
        field = loc.split(".")[0] if loc else model_cls.__name__
        name = (setting_names or {}).get(field, "--" + field.replace("_", "-"))
        raise ConfigError(name, str(err.get("msg", exc))) from exc
