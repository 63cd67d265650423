"""The HTTP edge: what a client can hold of the gateway before it has been authenticated.

* ``read_body``: the body cap checked against Content-Length before a byte is read (413), chunked
  bodies counted as they arrive (413 at the first byte past the cap), and one deadline for the
  whole body (408), so a slow sender holds a connection for ``body_timeout_s`` at most.
* Compressed bodies: aiohttp's own inflation is off (it would run on the event loop, and count
  against the cap only once inflated: 255 KB of gzip became 250 MiB). A body with a
  ``Content-Encoding`` is refused (415) before it is read, unless ``max_inflation_ratio`` allows
  gzip/deflate: then the compressed bytes count against the cap as they arrive, and they are
  inflated in a thread, to at most ``max_bytes`` and ``ratio`` x their size (413 past either).
* Header deadline: aiohttp's keep-alive timer also runs from the moment a connection opens until
  its first request's headers are complete (and again between requests), and closes the connection
  if they are not; ``header_timeout_s`` is that timer.
* ``ConnectionGuard``: at most ``max_connections`` open client connections. At the cap, a new
  connection first displaces the oldest connection that has never sent a complete request (a slow
  or silent client), else the oldest idle keep-alive connection; only when every connection is
  busy with a request is
  the new one answered ``503`` with ``Retry-After`` and closed. A flood of slow connections thus
  never shuts out a client that sends a request promptly.
* ``raise_fd_limit``: the process's soft open-files limit raised towards its hard limit, so the cap
  is reached before ``accept()`` fails (which would stall every client).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import resource
import zlib
from collections.abc import Callable
from concurrent.futures import Executor
from typing import cast

import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from mmgate.errors import BodyTimeoutError, BodyTooLargeError, InvalidRequestError, UnsupportedEncodingError

log = logging.getLogger(__name__)
# File descriptors kept for everything but client connections (backends, origins, Redis, logs).
FD_RESERVE = 2048
_JOIN_IN_THREAD_BYTES = 1 << 20


# zlib's wbits for each Content-Encoding accepted: gzip framing, and deflate as zlib framing or raw
# (HTTP's "deflate" is zlib framing; some clients send raw deflate: 47 detects gzip or zlib).
_WBITS = {"gzip": 31, "x-gzip": 31, "deflate": 47}


def body_encoding(request: web.Request, max_inflation_ratio: int) -> str | None:
    """The body's Content-Encoding to inflate (None: none), or 415 when it is not accepted."""
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if not encoding or encoding == "identity":
        return None
    if max_inflation_ratio <= 0:
        raise UnsupportedEncodingError(
            f"request bodies with Content-Encoding: {encoding[:32]} are not accepted: send the body "
            "uncompressed", param="Content-Encoding")
    if encoding not in _WBITS:
        raise UnsupportedEncodingError(
            f"Content-Encoding: {encoding[:32]} is not supported (gzip or deflate)", param="Content-Encoding")
    return encoding


def inflate(raw: bytes, encoding: str, *, max_bytes: int, ratio: int) -> bytes:
    """``raw`` inflated, to at most ``min(max_bytes, ratio * len(raw))`` bytes (blocking: call it in
    a thread). 413 past the limit, 400 for data that is not what its encoding says."""
    limit = min(max_bytes, ratio * max(len(raw), 1))
    inflater = zlib.decompressobj(_WBITS[encoding])
    try:
        out = inflater.decompress(raw, limit + 1)
    except zlib.error as exc:
        raise InvalidRequestError(f"request body is not valid {encoding} data: {exc}",
                                  param="Content-Encoding") from exc
    if len(out) > limit or inflater.unconsumed_tail:
        raise BodyTooLargeError(
            f"request body inflates past {limit} bytes ({len(raw)} compressed; the limits are "
            f"--max-body-bytes and --max-inflation-ratio {ratio})")
    if not inflater.eof:
        raise InvalidRequestError(f"request body is truncated {encoding} data", param="Content-Encoding")
    return out


async def read_body(
    request: web.Request, *, max_bytes: int, timeout_s: float, max_inflation_ratio: int = 0,
    inflate_pool: Executor | None = None,
) -> bytes:
    """The request body, at most ``max_bytes``, within ``timeout_s``, inflated when compressed
    (see the module docstring) in ``inflate_pool`` (the gateway's low-priority threads: inflating
    is the one CPU cost a client sets by what it sends, so it takes what the rest leaves)."""
    encoding = body_encoding(request, max_inflation_ratio)
    raw = await _read_raw(request, max_bytes=max_bytes, timeout_s=timeout_s)
    if encoding is None:
        return raw
    work = functools.partial(inflate, raw, encoding, max_bytes=max_bytes, ratio=max_inflation_ratio)
    return await asyncio.get_running_loop().run_in_executor(inflate_pool, work)


_NO_WAIT = contextlib.nullcontext()


async def _read_raw(request: web.Request, *, max_bytes: int, timeout_s: float) -> bytes:
    declared = request.content_length
    if declared is not None and declared > max_bytes:
        raise BodyTooLargeError(f"request body of {declared} bytes is over the {max_bytes}-byte limit")
    # readchunk hands over one buffered chunk at a time (readany joins what is buffered, on the
    # loop); the chunks of a large body are joined in a thread, where bytes.join drops the GIL
    # (on the loop, a 100 MB body's join held every other request ~100 ms).
    chunks: list[bytes] = []
    received = 0
    content = request.content
    # A body already whole in the buffer (a small one comes in the head's packet) has nothing to
    # wait for: taken in one call, no deadline timer to arm and cancel.
    whole = content.is_eof()
    try:
        if whole and content.total_bytes < _JOIN_IN_THREAD_BYTES:
            raw = content.read_nowait()
            if len(raw) > max_bytes:
                raise BodyTooLargeError(f"request body is over the {max_bytes}-byte limit")
            return raw
        async with _NO_WAIT if whole else asyncio.timeout(timeout_s):
            while True:
                chunk, _ = await content.readchunk()
                if not chunk:
                    break
                received += len(chunk)
                if received > max_bytes:
                    raise BodyTooLargeError(f"request body is over the {max_bytes}-byte limit")
                chunks.append(chunk)
    except TimeoutError as exc:
        raise BodyTimeoutError(
            f"request body not received within {timeout_s:g}s ({received} bytes arrived)"
        ) from exc
    except web.RequestPayloadError as exc:
        # aiohttp could not decode the body (a Content-Encoding that is not what it says, broken
        # chunked framing): the client's fault, a 400 — not aiohttp's plain-text 500.
        reason = getattr(exc.__cause__, "message", None) or str(exc) or "malformed body"
        raise InvalidRequestError(f"request body could not be read: {str(reason).strip()}") from exc
    if received >= _JOIN_IN_THREAD_BYTES:
        return await asyncio.to_thread(b"".join, chunks)
    return b"".join(chunks)


def _busy_response() -> bytes:
    body = orjson.dumps({"error": {
        "message": "the gateway is at its connection limit: retry shortly",
        "type": "rate_limit_error", "param": None, "code": "too_many_connections"}})
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
            b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class _Refuse(asyncio.Protocol):
    """Answers 503 at once and ends the connection: it is never handed to aiohttp.

    The answer is followed by a half-close, and what the client sends meanwhile is read and dropped
    for a moment before the close: closing with unread data would send a reset, and the client
    could lose the answer before reading it.
    """

    LINGER_S = 0.5

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        transport.write(_busy_response())
        if transport.can_write_eof():
            transport.write_eof()
        asyncio.get_running_loop().call_later(self.LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        pass  # dropped: the answer is already out

    def eof_received(self) -> bool:
        return False  # the client is done: close now


def _is_idle(handler: RequestHandler) -> bool:
    """True when ``handler``'s connection is not inside a request: no complete request received
    (slow headers) or waiting for the next one (``_waiter``). A request taken off the queue whose
    handler task has not run yet (on Python 3.11 tasks do not start eagerly) is inside one. Reads
    aiohttp's ``RequestHandler`` internals (aiohttp is pinned for them: tests/test_aiohttp_pin.py;
    the edge tests pin the behaviour)."""
    return (not handler._request_in_progress and not handler._messages and not handler._force_close
            and (handler._request_count == 0 or handler._waiter is not None))


class ConnectionGuard:
    """A protocol factory in front of aiohttp's ``web.Server`` that caps open connections.

    Its cost per new connection at the cap does not grow with the cap: connections it displaced
    and that are still closing are tracked apart (they leave aiohttp's table a moment later), so
    the open count is the table's size less those; a full scan of the table is left for the rare
    case where no connection can be displaced. (A scan per new connection made a flood of
    reconnecting slow clients cost the event loop two thirds of its time at 8192 connections.)
    """

    def __init__(self, server: web.Server, max_connections: int,
                 on_event: Callable[[str], None] | None = None) -> None:
        self._server = server
        self.max_connections = max_connections
        self._on_event = on_event or (lambda _event: None)
        self._closing: list[RequestHandler] = []  # displaced, not yet out of the server's table

    def open_connections(self) -> int:
        """Open connections: the server's table less those being closed (a full scan)."""
        return sum(1 for h in self._server._connections if not h._force_close)

    def __call__(self) -> asyncio.Protocol:
        conns = self._server._connections  # insertion order: oldest first
        if len(conns) >= self.max_connections:
            self._closing = [h for h in self._closing if h in conns]
            if len(conns) - len(self._closing) >= self.max_connections and not self._displace() \
                    and self.open_connections() >= self.max_connections:
                self._on_event("refused")
                return _Refuse()
        return self._server()

    def _displace(self) -> bool:
        """Close one connection to make room (False: none could be): oldest first among those that
        never sent a whole request (slow or silent clients), then among idle keep-alive
        connections: a client that did send requests goes last."""
        conns = self._server._connections
        victim = next((h for h in conns if h._request_count == 0 and _is_idle(h)), None)
        if victim is None:
            victim = next((h for h in conns if _is_idle(h)), None)
        if victim is None:
            return False
        victim.force_close()
        self._closing.append(victim)
        self._on_event("displaced")
        return True


class GuardedSite(web.BaseSite):
    """An aiohttp site listening on ``host:port`` with ``ConnectionGuard`` as the protocol factory
    (aiohttp's ``TCPSite`` would hand connections to the bare server)."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, max_connections: int,
                 on_event: Callable[[str], None] | None = None, backlog: int = 1024) -> None:
        super().__init__(runner, backlog=backlog)
        self._app_runner = runner
        self._host = host
        self._port = port
        self._listen_backlog = backlog
        self._max_connections = max_connections
        self._on_event = on_event
        self._listening: asyncio.Server | None = None
        self.guard: ConnectionGuard | None = None

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self.bound_port}"

    @property
    def bound_port(self) -> int:
        sockets = self._listening.sockets if self._listening is not None else ()
        return int(sockets[0].getsockname()[1]) if sockets else self._port

    async def start(self) -> None:
        await super().start()  # registers the site with its runner
        server = self._app_runner.server
        assert server is not None  # the runner is set up
        self.guard = ConnectionGuard(server, self._max_connections, self._on_event)
        self._listening = await asyncio.get_running_loop().create_server(
            self.guard, self._host, self._port, backlog=self._listen_backlog, reuse_address=True)

    async def stop(self) -> None:
        if self._listening is not None:
            self._listening.close()
        await super().stop()


def raise_fd_limit(wanted: int) -> int:
    """Raise the soft RLIMIT_NOFILE to ``wanted`` (capped by the hard limit); return the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:  # not allowed here: keep the limit we have
            log.warning("cannot raise the open-files limit to %d: %s", target, exc)
    return soft


def connection_cap(max_connections: int) -> int:
    """``max_connections`` within what the open-files limit allows (logged when lowered)."""
    soft = raise_fd_limit(max_connections + FD_RESERVE)
    allowed = max(64, soft - FD_RESERVE)
    if allowed < max_connections:
        log.warning("--max-connections %d lowered to %d: the open-files limit is %d (ulimit -n)",
                    max_connections, allowed, soft)
        return allowed
    return max_connections
