"""How the gateway names its backends (``--backend KIND=URL``, ``--backend-dns KIND=URL``) and the DNS
server it asks: a part of ``mmgate.config``, kept in a module of its own so that each stays small."""

from __future__ import annotations

import ipaddress
from typing import Literal
from urllib.parse import urlsplit

from pydantic import ValidationError, field_validator

from mmgate._settings import ConfigError, Frozen

__all__ = ["BackendSpec", "dns_server_address"]


class BackendSpec(Frozen):
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
    def parse(cls, text: str, *, flag: str = "--backend") -> BackendSpec:
        """Parse ``KIND=URL`` (``vllm=http://10.0.0.5:8000``)."""
        kind, sep, url = text.partition("=")
        if not sep:
            raise ConfigError(flag, f"expected KIND=URL (kind vllm or openai), got {text!r}")
        try:
            return cls(kind=kind.strip().lower(), url=url.strip())
        except ValidationError as exc:
            raise ConfigError(flag, _first_error(exc)) from exc


def dns_server_address(text: str) -> tuple[str, int]:
    """``IP`` or ``IP:PORT`` (``[IPv6]:PORT``) of a DNS server → (ip, port; 53 by default)."""
    host, port = text.strip(), 53
    if host.startswith("["):
        host, _, rest = host[1:].partition("]")
        if rest:
            port = _dns_port(rest.removeprefix(":"), text)
    elif host.count(":") == 1:
        host, _, rest = host.partition(":")
        port = _dns_port(rest, text)
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"DNS server must be IP[:PORT], got {text!r}") from None
    return host, port


def _dns_port(text: str, whole: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"DNS server port must be 1-65535, got {whole!r}")
    return int(text)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    return str(err.get("msg", exc))
