"""HTTP client for OpenAI-compatible backends (``vllm`` and ``openai`` kinds).

The two kinds speak the same HTTP; they differ in what the gateway puts in the body (uuids or not),
which is decided before ``chat`` is called. Every request, and the health, model and load probes,
goes through aiohttp's client, whose errors are translated here and nowhere else.

A backend's reply is bounded: its head by aiohttp's parser and a stray reply kept from the next
request (``mmgate.backends.session``: 502), a non-streamed body at most ``max_reply_bytes`` (502
past it, read no further), the head and a whole non-streamed body within ``reply_timeout_s`` (504;
interim ``1xx`` replies do not reset it), each stream chunk within ``read_timeout_s`` of the last.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping
from types import TracebackType

import aiohttp
import orjson
from multidict import CIMultiDict

from mmgate.backends.base import CHAT_PATH, BackendKind, BackendReply, error_message
from mmgate.backends.session import ReplyTooLarge, StaleConnection, new_session, read_capped, request
from mmgate.backends.tenant_share import ConnectionShares, holding
from mmgate.errors import (
    BackendBusyError,
    BackendConnectError,
    BackendProtocolError,
    BackendStatusError,
    BackendTimeoutError,
)
from mmgate.observe import backend_headers, request_tenant

log = logging.getLogger(__name__)
_PROBE_CONNECTIONS = 4
_JSON_HEADERS = {"Content-Type": "application/json"}


class HTTPBackend:
    """An OpenAI-compatible server reached over HTTP."""

    def __init__(
        self,
        name: str,
        kind: BackendKind,
        url: str,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        max_connections: int = 1024,
        keepalive_s: float = 4.0,
        reply_timeout_s: float = 1800.0,
        max_reply_bytes: int = 256 << 20,
        api_key: str | None = None,
    ) -> None:
        self.name = name
        self.kind: BackendKind = kind
        self.url = url.rstrip("/")
        self._chat_url = self.url + CHAT_PATH
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout_s, sock_connect=connect_timeout_s, sock_read=read_timeout_s
        )
        self._probe_timeout = aiohttp.ClientTimeout(total=min(5.0, read_timeout_s), connect=connect_timeout_s)
        self._reply_timeout_s = reply_timeout_s
        self._max_reply_bytes = max_reply_bytes
        # The backend's own credentials, sent to it only; a client's Authorization never replaces them.
        self._auth: dict[str, str] = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._headers = {**_JSON_HEADERS, **self._auth}
        self._max_connections = max_connections
        self.shares = ConnectionShares(name, max_connections)  # each tenant's connections (tenant_share)
        self._keepalive_s = keepalive_s
        self._session: aiohttp.ClientSession | None = None
        # Requests that hold (or wait for) a pool connection: past the pool's size, a connect
        # timeout is the wait for a free connection, not a backend that fails to accept one.
        self._in_use = 0
        # Health, model and load probes have a small pool of their own: requests that fill the
        # request pool (streams a client reads slowly) must not make a healthy backend fail its
        # probes and be ejected.
        self._probe_session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = new_session(self._max_connections, self._timeout, self._keepalive_s)
        return self._session

    def _probes(self) -> aiohttp.ClientSession:
        if self._probe_session is None or self._probe_session.closed:
            self._probe_session = new_session(_PROBE_CONNECTIONS, self._timeout, self._keepalive_s)
        return self._probe_session

    def _translated(self, doing: str, *, sent: bool) -> _Translated:
        """The one place aiohttp's errors become mmgate's (``_Translated``)."""
        return _Translated(self, doing, sent)

    def _log(self, doing: str, exc: BaseException) -> None:
        log.warning("backend %s (%s) failed %s: %s", self.name, self.url, doing, exc or type(exc).__name__)

    async def chat(self, body: bytes, *, stream: bool, path: str = CHAT_PATH) -> BackendReply:
        give_back = self.shares.take(request_tenant())  # 429 at the tenant's share of the connections
        try:
            reply = await self._chat(body, stream=stream, path=path)
        except BaseException:
            give_back()
            raise
        return holding(reply, give_back)

    async def _chat(self, body: bytes, *, stream: bool, path: str) -> BackendReply:
        data: bytes | AsyncIterator[memoryview] = body
        headers = self._headers
        if len(body) > _PIECE_BYTES:
            # Written a piece at a time (with its length up front): one write of a 100 MB body
            # held the event loop ~140 ms while the transport buffered it.
            data = _pieces(body)
            headers = {**self._headers, "Content-Length": str(len(body))}
        if (observed := backend_headers()) is not None:  # the request id and trace context
            headers = {**headers, **observed}
        url = self._chat_url if path == CHAT_PATH else self.url + path
        return await self._send("POST", url, data, headers, stream=stream)

    async def request(
        self, method: str, path: str, *, body: bytes | AsyncIterable[bytes] | None = None,
        headers: Mapping[str, str] | None = None, stream: bool = False,
    ) -> BackendReply:
        sent = CIMultiDict(headers) if headers else CIMultiDict()
        if (observed := backend_headers()) is not None:  # the request id and trace context
            sent.update(observed)
        if self._auth:
            sent.update(self._auth)  # replaces a client's Authorization the caller chose to pass
        give_back = self.shares.take(request_tenant())
        try:
            reply = await self._request(method, path, body, sent, stream=stream)
        except BaseException:
            give_back()
            raise
        return holding(reply, give_back)

    async def _request(self, method: str, path: str, body: bytes | AsyncIterable[bytes] | None,
                       sent: CIMultiDict[str], *, stream: bool) -> BackendReply:
        data: bytes | AsyncIterable[bytes] | AsyncIterator[memoryview] | None = body
        if isinstance(body, bytes) and len(body) > _PIECE_BYTES:
            data = _pieces(body)
            sent["Content-Length"] = str(len(body))
        return await self._send(method, self.url + path, data, sent, stream=stream)

    async def _send(
        self, method: str, url: str, data: bytes | AsyncIterable[bytes] | AsyncIterator[memoryview] | None,
        headers: Mapping[str, str], *, stream: bool,
    ) -> BackendReply:
        """One request; the reply whole, or streamed when asked for and the backend streams (200,
        an event stream). An error status is always read whole. The head, and a whole body, by
        ``reply_timeout_s`` (module docstring)."""
        self._in_use += 1
        streaming = False
        deadline = asyncio.get_running_loop().time() + self._reply_timeout_s
        try:
            with self._translated("before answering", sent=False):
                try:
                    async with asyncio.timeout_at(deadline):
                        resp = await request(self._client(), method, url, data, headers)
                except StaleConnection as exc:
                    raise BackendProtocolError(f"backend {self.name} sent replies nobody asked for") from exc
                except aiohttp.ConnectionTimeoutError as exc:
                    if self._in_use > self._max_connections:
                        raise BackendBusyError(
                            f"backend {self.name} has all its {self._max_connections} connections in use "
                            "(--backend-max-connections); retry shortly") from exc
                    raise
            content_type = resp.headers.get("Content-Type", "application/json")
            if resp.status != 200 or not stream or not content_type.startswith("text/event-stream"):
                try:
                    with self._translated("while answering", sent=True):
                        async with asyncio.timeout_at(deadline):
                            body = await read_capped(resp, self._max_reply_bytes)
                except ReplyTooLarge as exc:
                    resp.close()
                    raise BackendProtocolError(f"backend {self.name} answered {exc} over the "
                                               f"{self._max_reply_bytes}-byte limit (--max-backend-reply-bytes)") from exc
                except BaseException:
                    resp.close()  # a half-read connection must not go back to the pool
                    raise
                finally:
                    resp.release()
                return BackendReply(status=resp.status, content_type=content_type, body=body)
            streaming = True  # the stream holds its connection until it is released
            content = resp.content
            return BackendReply(status=200, content_type=content_type, stream=self._relay(resp),
                                _release=self._releaser(resp),
                                _arrived=lambda: content.total_bytes > 0 or content.is_eof(),
                                _ended=content.at_eof)
        finally:
            if not streaming:
                self._in_use -= 1

    def _releaser(self, resp: aiohttp.ClientResponse) -> Callable[[], None]:
        """Close a streamed response and give its pool slot back (once)."""
        held = True

        def release() -> None:
            nonlocal held
            resp.close()
            if held:
                held = False
                self._in_use -= 1

        return release

    async def _relay(self, resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        """Yield the SSE bytes as they arrive (no re-framing: frames pass through unchanged)."""
        try:
            with self._translated("mid-stream", sent=True):
                async for chunk in resp.content.iter_any():
                    yield chunk
        finally:
            resp.release()

    async def models(self) -> list[str]:
        with self._translated("listing its models", sent=False):
            async with self._probes().get(self.url + "/v1/models", timeout=self._probe_timeout,
                                         headers=self._auth) as resp:
                if resp.status != 200:
                    raise BackendStatusError(
                        f"backend {self.name} /v1/models answered {resp.status}", backend_status=resp.status
                    )
                raw = await resp.read()
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise BackendProtocolError(f"backend {self.name} /v1/models is not JSON") from exc
        items = data.get("data") if isinstance(data, dict) else None
        return [str(m["id"]) for m in items or [] if isinstance(m, dict) and "id" in m]

    async def healthy(self) -> bool:
        path = "/health" if self.kind == "vllm" else "/v1/models"
        try:
            async with self._probes().get(self.url + path, timeout=self._probe_timeout, headers=self._auth) as resp:
                await resp.read()
                return resp.status == 200
        except (TimeoutError, aiohttp.ClientError):
            # A failed probe is the answer itself: unhealthy.
            return False

    async def close(self) -> None:
        for session in (self._session, self._probe_session):
            if session is not None:
                await session.close()


class _Translated:
    """A ``with`` block whose aiohttp errors become mmgate's. ``sent``: the request had reached
    the backend, so a dropped connection is a broken answer (502), not an unreachable backend
    (502, and safe to retry elsewhere). The client reads the backend's name only; its address and
    aiohttp's words (which name it) go to the log. A class, not a generator: it is entered on
    every request, and a generator-based context manager costs several times as much."""

    __slots__ = ("backend", "doing", "sent")

    def __init__(self, backend: HTTPBackend, doing: str, sent: bool) -> None:
        self.backend = backend
        self.doing = doing
        self.sent = sent

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is None or not isinstance(exc, aiohttp.ClientError | TimeoutError):
            return  # no error, or not aiohttp's (CancelledError included): it goes on as it is
        backend, doing = self.backend, self.doing
        name = backend.name
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            # Also a TimeoutError, so tested first: no connection was made (or none came free in
            # the pool), nothing was sent, and another backend may take the request.
            backend._log(doing, exc)
            raise BackendConnectError(f"backend {name} did not accept a connection "
                                      f"within the connect timeout") from exc
        if isinstance(exc, aiohttp.ClientConnectorError):
            # Refused, reset or unreachable while connecting (before a byte of the request left).
            backend._log(doing, exc)
            raise BackendConnectError(f"backend {name} is unreachable") from exc
        if isinstance(exc, TimeoutError):
            # A read timeout (aiohttp's SocketTimeoutError or our own): the request was sent.
            raise BackendTimeoutError(f"backend {name} timed out {doing}") from exc
        backend._log(doing, exc)
        if isinstance(exc, aiohttp.ClientConnectionError):
            if not self.sent:
                raise BackendConnectError(f"backend {name} is unreachable") from exc
            raise BackendProtocolError(f"backend {name} broke off {doing}") from exc
        raise BackendProtocolError(f"backend {name} failed {doing}") from exc


def status_error(backend: str, status: int, body: bytes) -> BackendStatusError:
    """Map a backend error reply to the error the client sees (a backend 400 stays a 400)."""
    try:
        parsed = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        parsed = None
    text = body[:300].decode("utf-8", "replace") if body else ""
    message = error_message(parsed, text or f"backend {backend} answered HTTP {status}")
    if status >= 500:
        message = f"backend {backend} answered HTTP {status}: {message}"
    return BackendStatusError(message, backend_status=status, body=parsed if isinstance(parsed, dict) else None)


_PIECE_BYTES = 1 << 20


async def _pieces(body: bytes) -> AsyncIterator[memoryview]:
    view = memoryview(body)
    for start in range(0, len(body), _PIECE_BYTES):
        yield view[start:start + _PIECE_BYTES]
