"""``HTTPBackend``'s requests to an ``http://`` backend on the lean client (``mmgate.backends.wire``):
each request's head built around a fixed part made once, the reply as a ``BackendReply`` (an event
stream relayed as its bytes come off the socket), and the client's errors mapped to the gateway
errors aiohttp's client gave (``_Translated`` in ``mmgate.backends.http``): unreachable or no
connection within the connect timeout 502 (nothing was answered: another backend may take it),
every pool connection in use 503, silence 504, a reply broken off or not HTTP 502."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Mapping
from functools import partial
from urllib.parse import quote, urlsplit

from mmgate.backends.base import CHAT_PATH, BackendReply, EarlyReply, early_reply
from mmgate.backends.wire import (
    BrokenOff,
    ConnectFailed,
    Exchange,
    OnReply,
    PoolFull,
    ReadTimeout,
    WireError,
    WirePool,
)
from mmgate.errors import (
    BackendBusyError,
    BackendConnectError,
    BackendProtocolError,
    BackendTimeoutError,
    UpstreamError,
)

# Headers the lean client writes itself (framing and the connection's own), never a caller's.
_OWN_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade", "te"})
# Methods sent without a Content-Length when they carry no body (as aiohttp sends them).
_BODILESS = frozenset({"GET", "HEAD", "OPTIONS", "CONNECT", "TRACE"})
_PATH_SAFE = "/?&=%:@!$'()*+,;~"  # a path and query's own characters, an escape's % kept


def lines(headers: Iterable[tuple[str, str]], count: int) -> str:
    """``headers`` as a request head's lines; a name or value that would break a line out of its
    header is refused (aiohttp's client refuses the same)."""
    block = "".join(f"{k}: {v}\r\n" for k, v in headers)
    if block.count("\n") != count or block.count("\r") != count:
        raise ValueError("a header name or value holds a line break")
    return block


class LeanClient:
    """One backend's requests on a ``WirePool`` (made at the first request, in its event loop)."""

    @classmethod
    def for_url(cls, name: str, url: str, auth: Mapping[str, str], *, max_connections: int,
                connect_timeout_s: float, read_timeout_s: float, keepalive_s: float,
                log: Callable[[str, BaseException], None]) -> LeanClient | None:
        """The client for ``url``, or None where aiohttp's client serves it (``https://``, or
        credentials, a query or a fragment in the URL)."""
        split = urlsplit(url)
        if split.scheme != "http" or not split.hostname or split.username is not None or split.query \
                or split.fragment:
            return None
        return cls(name, split.hostname, split.port or 80, split.netloc, split.path, auth,
                   max_connections=max_connections, connect_timeout_s=connect_timeout_s,
                   read_timeout_s=read_timeout_s, keepalive_s=keepalive_s, log=log)

    def __init__(self, name: str, host: str, port: int, netloc: str, base_path: str, auth: Mapping[str, str], *,
                 max_connections: int, connect_timeout_s: float, read_timeout_s: float, keepalive_s: float,
                 log: Callable[[str, BaseException], None]) -> None:
        self.name = name
        self._address = (host, port)
        self._base_path = base_path
        self._fixed = f"Host: {netloc}\r\nUser-Agent: mmgate\r\n" + lines(auth.items(), len(auth))
        self._chat_head = f"POST {base_path}{CHAT_PATH} HTTP/1.1\r\n{self._fixed}Content-Type: application/json\r\n"
        self._limits = (max_connections, connect_timeout_s, read_timeout_s, keepalive_s)
        self._log = log
        self._pool: WirePool | None = None

    async def chat(self, body: bytes, observed: Mapping[str, str] | None, *, stream: bool, path: str) -> BackendReply:
        """POST a JSON ``body`` to ``path`` with the request's ``observed`` headers (id, trace)."""
        head = self._chat_head if path == CHAT_PATH else \
            f"POST {self._base_path}{path} HTTP/1.1\r\n{self._fixed}Content-Type: application/json\r\n"
        extra = "" if observed is None else lines(observed.items(), len(observed))
        early = early_reply()
        on_reply = None if early is None else partial(_stream_early if stream else _whole_early, early)
        return await self._send(f"{head}{extra}Content-Length: {len(body)}\r\n\r\n".encode(), body, stream=stream,
                                on_reply=on_reply)

    async def request(self, method: str, path: str, headers: Iterable[tuple[str, str]],
                      body: bytes | AsyncIterable[bytes] | None, *, stream: bool) -> BackendReply:
        """Any request (``HTTPBackend.request``); ``headers`` already merged, the backend's key in."""
        if not (path.isascii() and path.isprintable()) or " " in path:
            path = quote(path, safe=_PATH_SAFE)  # as aiohttp's URL would send it; never a broken request line
        passed = [(k, v) for k, v in headers if k.lower() not in _OWN_HEADERS]
        if isinstance(body, bytes):
            framing = f"Content-Length: {len(body)}\r\n"
        elif body is None:
            framing = "" if method in _BODILESS else "Content-Length: 0\r\n"
        else:
            framing = "Transfer-Encoding: chunked\r\n"
        head = f"{method} {self._base_path}{path} HTTP/1.1\r\n{self._fixed}{lines(passed, len(passed))}{framing}\r\n"
        return await self._send(head.encode(), body, stream=stream, head_only=method == "HEAD")

    def _new_pool(self) -> WirePool:
        limit, connect_s, read_s, keepalive_s = self._limits
        self._pool = WirePool(*self._address, limit=limit, connect_timeout_s=connect_s, read_timeout_s=read_s,
                              keepalive_s=keepalive_s)
        return self._pool

    async def _send(self, head: bytes, body: bytes | AsyncIterable[bytes] | None, *, stream: bool,
                    head_only: bool = False, on_reply: OnReply | None = None) -> BackendReply:
        """The reply whole, or streamed when asked for and the backend streams (200, an event
        stream); an error status is always read whole."""
        pool = self._pool or self._new_pool()
        try:
            ex = await pool.send(head, body, head_only=head_only, on_reply=on_reply, at_head=stream)
        except WireError as exc:
            raise self._error(exc, "before answering") from exc
        content_type = ex.content_type or "application/json"
        if ex.status != 200 or not stream or not content_type.startswith("text/event-stream"):
            try:
                data = await ex.read_all()
            except WireError as exc:
                raise self._error(exc, "while answering") from exc
            finally:
                ex.finish()  # read whole: back to the pool (done already); else closed
            return BackendReply(status=ex.status, content_type=content_type, body=data)
        ex.streaming = True
        return BackendReply(status=200, content_type=content_type, stream=self._relay(ex),
                            _release=ex.finish, _arrived=ex.arrived, _ended=ex.ended)

    def _relay(self, ex: Exchange) -> AsyncIterator[bytes]:
        """The event stream as its bytes come off the socket (no re-framing)."""
        return _Relay(ex, self._error)

    def _error(self, exc: WireError, doing: str) -> UpstreamError:
        """The gateway error for ``exc`` (module docstring); the reply's head not yet here is
        "before answering"."""
        name = self.name
        if not exc.answered:
            doing = "before answering"
        if isinstance(exc, PoolFull):
            return BackendBusyError(f"backend {name} has all its {self._limits[0]} connections in use "
                                    "(--backend-max-connections); retry shortly")
        if isinstance(exc, ReadTimeout):
            return BackendTimeoutError(f"backend {name} timed out {doing}")
        self._log(doing, exc)
        if isinstance(exc, ConnectFailed):
            if exc.timed_out:
                return BackendConnectError(f"backend {name} did not accept a connection within the connect timeout")
            return BackendConnectError(f"backend {name} is unreachable")
        if isinstance(exc, BrokenOff):
            if not exc.answered:
                return BackendConnectError(f"backend {name} is unreachable")
            return BackendProtocolError(f"backend {name} broke off {doing}")
        return BackendProtocolError(f"backend {name} failed {doing}")

    @property
    def pool(self) -> WirePool | None:
        return self._pool

    def close(self) -> None:
        """Close the idle connections; a request after this makes a new pool, as aiohttp's
        session would."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def _whole_early(early: EarlyReply, ex: Exchange) -> None:
    early.write_whole(ex.content_type, ex.whole())


def _stream_early(early: EarlyReply, ex: Exchange) -> None:
    """A stream request's 200 head: an event stream goes out with what arrived of it (anything
    else is read whole by the request's task, as ``_send`` does)."""
    if (ex.content_type or "").startswith("text/event-stream"):
        early.write_stream(ex.content_type, ex.take(), ex.ended())


class _Relay:
    """An event stream's chunks as they come off the socket. An async iterator, not an async
    generator: the event loop keeps no record of it (a generator costs a weak-set entry and a
    finalizer per stream). It ends the exchange when the stream ends or fails; one abandoned is
    ended by its reply's ``release`` (``BackendReply``)."""

    __slots__ = ("_error", "_ex")

    def __init__(self, ex: Exchange, error: Callable[[WireError, str], UpstreamError]) -> None:
        self._ex = ex
        self._error = error

    def __aiter__(self) -> _Relay:
        return self

    async def __anext__(self) -> bytes:
        ex = self._ex
        while True:
            chunk = ex.take()
            if chunk is not None:
                return chunk
            if ex.complete:
                ex.finish()
                raise StopAsyncIteration
            try:
                await ex.wait()
            except WireError as exc:
                ex.finish()
                raise self._error(exc, "mid-stream") from exc
