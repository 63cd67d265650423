"""An aiohttp resolver that checks every resolved address against the URL policy.

aiohttp's connector asks its resolver for a host's addresses and connects to exactly what it
returns, so checking here pins the connection to the checked addresses: a DNS answer that
changes between a check and the connect (DNS rebinding) cannot slip through, because there is
no second lookup. Literal-IP hosts never reach a resolver; ``UrlPolicy.check_url`` covers them.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp.abc import AbstractResolver, ResolveResult

from mmgate.errors import ForbiddenURLError, OriginTimeoutError
from mmgate.media.addresses import IPAddress
from mmgate.media.url_policy import UrlPolicy

# (host, port, family) -> getaddrinfo-style tuples; tests plug in a scripted DNS here.
Lookup = Callable[[str, int, int], Awaitable[list[tuple[Any, ...]]]]


class PolicyResolver(AbstractResolver):
    """Resolves through the event loop's ``getaddrinfo`` (or ``lookup``) and refuses the host
    unless every address passes ``policy.check_resolved``; bounded by ``timeout_s``."""

    def __init__(self, policy: UrlPolicy, *, timeout_s: float, lookup: Lookup | None = None) -> None:
        self._policy = policy
        self._timeout_s = timeout_s
        self._lookup = lookup

    async def _getaddrinfo(self, host: str, port: int, family: int) -> list[tuple[Any, ...]]:
        if self._lookup is not None:
            return await self._lookup(host, port, family)
        loop = asyncio.get_running_loop()
        return await loop.getaddrinfo(host, port, family=family, type=socket.SOCK_STREAM)

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        try:
            async with asyncio.timeout(self._timeout_s):
                infos = await self._getaddrinfo(host, port, family)
        except TimeoutError as exc:
            # Not an OSError subclass of ours: aiohttp passes MediaErrors through unwrapped.
            raise OriginTimeoutError(
                f"timed out resolving host {host} (limit {self._timeout_s:g}s)"
            ) from exc
        except UnicodeError as exc:  # getaddrinfo's IDNA step: a host the URL policy let through
            raise ForbiddenURLError(f"invalid host {host!r}: {exc}") from exc
        results: list[ResolveResult] = []
        checked: list[IPAddress] = []
        for fam, _type, proto, _canon, sockaddr in infos:
            if fam not in (socket.AF_INET, socket.AF_INET6):
                continue
            text = str(sockaddr[0]).split("%", 1)[0]
            checked.append(ipaddress.ip_address(text))
            results.append(
                ResolveResult(
                    hostname=host,
                    host=str(sockaddr[0]),
                    port=int(sockaddr[1]),
                    family=fam,
                    proto=proto,
                    flags=socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
                )
            )
        # Raises ForbiddenURLError (not an OSError): aiohttp lets it through unwrapped.
        self._policy.check_resolved(host, checked)
        return results

    async def close(self) -> None:
        return None
