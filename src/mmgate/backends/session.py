"""aiohttp's client as the backends use it, bounded as it allows (``HTTPBackend`` holds the
sessions; a request's deadlines are its own):

* ``new_session``: a pool of keep-alive connections to one backend, a reply's head at most
  ``MAX_HEAD_LINE_BYTES`` a line and ``MAX_HEADERS`` header lines (aiohttp's parser refuses more:
  a ``ClientResponseError``), no cookie jar, nothing read from the environment.
* A reply the backend sends after the one asked for never reaches another request: a pooled
  connection that received bytes while idle is refused before a byte of the next request is
  written on it (``_CheckedRequest``, raising ``StaleConnection``; aiohttp closes it), and
  ``request`` sends on another. aiohttp's pool alone would hand the stray reply to whoever asks next.
* ``read_capped``: a whole body, at most ``limit`` bytes (``ReplyTooLarge`` past it, nothing more
  read).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Mapping

import aiohttp
from aiohttp.connector import Connection

# The longest line (status line or one header) and the most header lines of a backend's reply
# head; vLLM's heads are a few short lines.
MAX_HEAD_LINE_BYTES = 8190
MAX_HEADERS = 128
# Pooled connections refused in a row (each held a stray reply) before the backend is at fault.
_STALE_TRIES = 4

Data = bytes | AsyncIterable[bytes] | AsyncIterator[memoryview] | None


class StaleConnection(Exception):
    """Every pooled connection tried had received bytes while idle (replies nobody asked for)."""


class ReplyTooLarge(Exception):
    """A whole body over its limit."""


class _Stale(Exception):
    """One pooled connection received bytes while idle; nothing of the request was written on it."""


class _CheckedRequest(aiohttp.ClientRequest):
    """aiohttp's request, refusing a pooled connection that received bytes while idle (module
    docstring). Reaches ``Connection.protocol`` and ``ResponseHandler.should_close`` (aiohttp is
    pinned for it; tests/test_aiohttp_pin.py checks both are there)."""

    async def send(self, conn: Connection) -> aiohttp.ClientResponse:
        protocol = conn.protocol
        if protocol is not None and protocol.should_close:
            raise _Stale
        return await super().send(conn)


def new_session(limit: int, timeout: aiohttp.ClientTimeout, keepalive_s: float) -> aiohttp.ClientSession:
    """A session of at most ``limit`` connections, idle ones kept ``keepalive_s``."""
    connector = aiohttp.TCPConnector(limit=limit, ttl_dns_cache=60, enable_cleanup_closed=True,
                                     keepalive_timeout=keepalive_s)
    # No cookie jar (a backend's cookies are nobody's business and the jar costs time on every
    # response) and no proxy/netrc lookups from the environment.
    return aiohttp.ClientSession(
        connector=connector, timeout=timeout, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False,
        request_class=_CheckedRequest, max_line_size=MAX_HEAD_LINE_BYTES, max_field_size=MAX_HEAD_LINE_BYTES,
        max_headers=MAX_HEADERS,
    )


async def request(session: aiohttp.ClientSession, method: str, url: str, data: Data,
                  headers: Mapping[str, str]) -> aiohttp.ClientResponse:
    """``session.request`` on a connection that holds nothing unread (``StaleConnection`` when
    none does after a few tries). Each refused connection is closed before the request is
    written, so the body (even a stream of pieces) is sent once."""
    for _ in range(_STALE_TRIES):
        try:
            return await session.request(method, url, data=data, headers=headers)
        except _Stale:
            continue  # aiohttp closed that connection; the next comes from the pool or is new
    raise StaleConnection


async def read_capped(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """``resp``'s whole body, at most ``limit`` bytes: a declared length past it is refused before
    a byte is read, a body that grows past it as soon as it does (``ReplyTooLarge``)."""
    declared = resp.content_length
    if declared is not None and declared > limit:
        raise ReplyTooLarge(f"a body of {declared} bytes")
    chunks: list[bytes] = []
    received = 0
    content = resp.content
    while chunk := await content.readany():
        received += len(chunk)
        if received > limit:
            raise ReplyTooLarge("a body")
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
