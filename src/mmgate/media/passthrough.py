"""URLs the gateway forwards without loading them (``audio_url`` / ``video_url`` parts): checked
with the same URL policy as image URLs before any backend sees them.

The backend fetches these itself, so the gateway checks what it can without fetching:

* ``data:`` URLs pass (they reach no host); ``file:`` URLs are refused (the gateway's
  ``--allowed-local-media-path`` is about the gateway's disk, not the backend's);
* http(s): scheme, host spelling, literal addresses and metadata names (``UrlPolicy.check_url``),
  then every address the host name resolves to now (``UrlPolicy.check_resolved``);
* the URL forwarded is the gateway's own serialisation of what it checked (fragment dropped), and a
  URL with whitespace, control characters, backslashes or raw non-ASCII is refused, so the backend's
  URL parser cannot read a different host than the one checked.

What it cannot check: a redirect the origin answers later, or a DNS answer that changes between
this lookup and the backend's (the backend resolves again). Run vLLM with
``VLLM_MEDIA_URL_ALLOW_REDIRECTS=0`` and ``--allowed-media-domains`` to close both (docs/SECURITY.md).
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from typing import Any

from mmgate.errors import ForbiddenURLError, OriginTimeoutError
from mmgate.media.addresses import IPAddress
from mmgate.media.dataurl import is_data_url
from mmgate.media.dns import Lookup
from mmgate.media.url_policy import UrlPolicy, redact_url

_UNSAFE = re.compile(r"[\x00-\x20\x7f-\uffff\\]")


async def check_passthrough_url(
    policy: UrlPolicy, url: str, *, timeout_s: float, lookup: Lookup | None = None, kind: str = "media"
) -> str:
    """The URL to forward for an audio/video part (``kind``: its type, ``video_url`` or
    ``audio_url``, which errors name), or ``ForbiddenURLError`` (400)."""
    if is_data_url(url):
        return url
    shown = redact_url(url)
    what = f"{kind} URL"
    if url[:5].lower() == "file:":
        raise ForbiddenURLError(f"file: URLs are refused in {kind} parts ({shown})")
    if _UNSAFE.search(url):
        raise ForbiddenURLError(
            f"{what} {shown} holds whitespace, control, backslash or raw non-ASCII characters; "
            "percent-encode them"
        )
    checked = policy.check_url(url, what=what)
    if checked.address is None:
        host = checked.host
        try:
            async with asyncio.timeout(timeout_s):
                infos = await _lookup(host, checked.url.port or 0, lookup)
        except TimeoutError as exc:
            raise OriginTimeoutError(f"timed out resolving host {host} (limit {timeout_s:g}s)") from exc
        except (OSError, UnicodeError) as exc:  # UnicodeError: getaddrinfo's IDNA step
            raise ForbiddenURLError(f"cannot resolve host {host} of {what} {shown}: "
                                    f"{getattr(exc, 'strerror', None) or exc}") from exc
        addresses: list[IPAddress] = []
        for info in infos:
            if info[0] in (socket.AF_INET, socket.AF_INET6):
                addresses.append(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]))
        policy.check_resolved(host, addresses)
    return str(checked.url.with_fragment(None))


async def _lookup(host: str, port: int, lookup: Lookup | None) -> list[tuple[Any, ...]]:
    if lookup is not None:
        return list(await lookup(host, port, socket.AF_UNSPEC))
    loop = asyncio.get_running_loop()
    return list(await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM))
