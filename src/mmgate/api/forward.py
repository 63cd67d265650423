"""Forwarding a request to a backend as it came: the seam of every passthrough endpoint, and of any
front end (Responses, Messages) for the requests it cannot map onto chat completions.

How to call it, from an aiohttp handler that has authenticated the client, read (or chosen to
stream) the body and policed every media field in it::

    forwarder = Forwarder(gateway)            # cheap; or request.app[FORWARDER_KEY]
    outcome = await forwarder.send(
        "POST", request.path_qs, raw,         # body: bytes, or an ``Upload`` streamed as it arrives
        model=model,                          # None: the fleet's one model (400 naming 'model' if several)
        session_id=gateway.session_id(request.headers),
        headers={"Content-Type": "application/json"},
    )
    try:
        response, complete = await deliver(request, outcome.reply, outcome.headers, gateway)
        return response
    finally:
        outcome.close()                       # frees the connection and the outstanding count

``send`` routes as chat does (``Router.ranked`` by model and session: same health, ejection and
outstanding counts; a model no backend lists goes to any backend, whose own answer the client
gets), fails over once to the next backend when nothing reached the first (a connect
failure; never after a streamed upload started), and returns the backend's reply with **any**
status: a non-200 reply comes back whole, untouched, for the caller to relay or translate (a
gateway that forwards answers the backend's own errors byte for byte). Its own failures raise
``MmgateError`` (no model named while the fleet serves several 400, backend unreachable 502,
silent 504). ``deliver`` relays a
reply: whole, or an event stream chunk by chunk without re-framing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import weakref
from collections.abc import AsyncIterator, Callable, Mapping

from aiohttp import web

from mmgate.api.edge import body_encoding
from mmgate.api.error_responses import error_frame
from mmgate.api.gateway import ChatOutcome, Gateway
from mmgate.backends import Backend, BackendReply
from mmgate.backends.base import drain
from mmgate.errors import (
    BackendBusyError,
    BackendConnectError,
    BackendTimeoutError,
    BodyTimeoutError,
    BodyTooLargeError,
    InvalidRequestError,
    MmgateError,
    ModelNotFoundError,
    ShuttingDownError,
    UpstreamError,
    relayed_status,
)
from mmgate.observe import note_model
from mmgate.observe.stream import observed_stream

log = logging.getLogger(__name__)
GATEWAY_KEY = web.AppKey("gateway", Gateway)


class Upload:
    """A client's request body sent on to a backend as it arrives (an audio upload), never held
    whole: at most ``max_bytes`` (413 at the first byte past it; a declared Content-Length over it
    is refused before the first byte) within ``timeout_s`` for the whole body (408). A body with a
    ``Content-Encoding`` is refused (415).

    ``prefix``: bytes already read from the body (a peek), sent first. A failure of the client's
    side is kept in ``error`` so the sender reports it instead of the broken backend request it
    causes."""

    def __init__(self, request: web.Request, *, max_bytes: int, timeout_s: float, prefix: bytes = b"") -> None:
        body_encoding(request, 0)  # a compressed upload is refused (415): it is streamed, never inflated
        declared = request.content_length
        if declared is not None and declared > max_bytes:
            raise BodyTooLargeError(f"request body of {declared} bytes is over the {max_bytes}-byte limit")
        self._content = request.content
        self._max_bytes = max_bytes
        self._timeout_s = timeout_s
        self._deadline = asyncio.get_running_loop().time() + timeout_s
        self._prefix = prefix
        self.received = len(prefix)
        self.started = False
        self.error: MmgateError | None = None

    async def read_chunk(self) -> bytes:
        """The next chunk of the body (b"" at its end), under the cap and the deadline."""
        try:
            async with asyncio.timeout_at(self._deadline):
                chunk, _ = await self._content.readchunk()
        except TimeoutError as exc:
            raise BodyTimeoutError(f"request body not received within {self._timeout_s:g}s "
                                   f"({self.received} bytes arrived)") from exc
        except web.RequestPayloadError as exc:
            raise InvalidRequestError(f"request body could not be read: {str(exc).strip()}") from exc
        self.received += len(chunk)
        if self.received > self._max_bytes:
            raise BodyTooLargeError(f"request body is over the {self._max_bytes}-byte limit")
        return chunk

    async def peek(self, limit: int) -> bytes:
        """Read ahead until at least ``limit`` bytes (or the whole body) are held; they are sent
        first. Returns what is held."""
        while len(self._prefix) < limit:
            chunk = await self.read_chunk()
            if not chunk:
                break
            self._prefix += chunk
        return self._prefix

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        self.started = True
        try:
            if self._prefix:
                yield self._prefix
            while chunk := await self.read_chunk():
                yield chunk
        except MmgateError as exc:
            self.error = exc
            raise


class Forwarder:
    """Sends requests to the backends of one gateway as they came (module docstring)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def single_model(self) -> str | None:
        """The model a request without one is for (``Gateway.default_model``)."""
        return self.gateway.default_model()

    def route(self, model: str | None, session_id: str | None) -> list[Backend]:
        """The backends to try, in order, for ``model`` (None: ``single_model``). A model no
        backend lists goes to any backend, which answers as vLLM does: its own 404 naming its
        served models, or a LoRA adapter it resolves by name."""
        if model is None:
            model = self.single_model()
            if model is None:
                return self.anywhere()
        try:
            return self.gateway.router.ranked(model, session_id)
        except ModelNotFoundError:
            return self.anywhere()

    def anywhere(self) -> list[Backend]:
        """Every backend, healthy ones first, least outstanding first: for requests about no model
        (``/version``)."""
        router = self.gateway.router
        return sorted(router.backends, key=lambda b: (not router.is_healthy(b), router.outstanding(b)))

    async def send(
        self, method: str, path: str, body: bytes | Upload | None, *, model: str | None,
        session_id: str | None, headers: Mapping[str, str] | None = None, stream: bool = True,
        backends: list[Backend] | None = None,
    ) -> ChatOutcome:
        """Forward one request; see the module docstring. ``backends``: the order to try instead
        of the router's (``route``)."""
        note_model(model)
        ranked = backends if backends is not None else self.route(model, session_id)
        try:
            return await self._tracked(ranked[0], method, path, body, headers, stream)
        except (BackendConnectError, BackendBusyError):
            # Nothing reached that backend (unreachable, or every connection to it in use): try
            # the next one once, unless the upload has started
            # (its bytes cannot be read again).
            if len(ranked) < 2 or (isinstance(body, Upload) and body.started):
                raise
            return await self._tracked(ranked[1], method, path, body, headers, stream)

    async def _tracked(
        self, backend: Backend, method: str, path: str, body: bytes | Upload | None,
        headers: Mapping[str, str] | None, stream: bool,
    ) -> ChatOutcome:
        """One send with the router's outstanding count and passive health reports."""
        router = self.gateway.router
        metrics = self.gateway.metrics
        router.begin(backend)
        try:
            reply = await backend.request(method, path, body=body, headers=headers, stream=stream)
        except UpstreamError as exc:
            router.end(backend)
            if isinstance(body, Upload) and body.error is not None:
                # The client's side failed (too large, too slow): its error, not the backend's.
                raise body.error from exc
            if isinstance(exc, BackendConnectError | BackendTimeoutError):
                router.report_failure(backend)
            raise
        except BaseException:
            router.end(backend)
            raise
        router.report_success(backend)
        if reply.status == 200:
            metrics.backend_ok(backend.name)
        else:
            metrics.backend_requests.labels(backend.name, f"http_{reply.status}").inc()
        return ChatOutcome(reply=reply, backend=backend, headers={"x-mmgate-backend": backend.name},
                           on_finish=lambda: router.end(backend))


# Headers of every relayed event stream: no cache may keep it, no proxy (nginx) may buffer it.
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def stream_cut() -> ShuttingDownError:
    """The error a stream cut at shutdown ends with (after the drain time)."""
    return ShuttingDownError("the gateway shut down before this stream finished; retry the request")


# The kernel send buffer of a client socket that gets an event stream (Linux doubles it): a few
# hundred tokens' worth. Left alone, Linux grows it up to ``tcp_wmem``'s maximum (4 MiB): a whole
# long answer fits, so a client that reads nothing never stalls the relay, and the gateway relays
# (and the engine generates) every token before the stall cut can see it. An event stream needs
# little: this much per round trip is thousands of tokens a second at 100 ms.
STREAM_SEND_BUFFER = 32 * 1024


# The client connections whose send buffer is already bound: the setting stays with the socket, so
# a keep-alive connection's later streams need no system call (weak: gone with the connection).
_BOUND: weakref.WeakSet[asyncio.BaseTransport] = weakref.WeakSet()


def _bound_send_buffer(request: web.Request) -> None:
    """Give the request's client socket a fixed, small send buffer (``STREAM_SEND_BUFFER``): an event
    stream follows. Once per connection (``_BOUND``)."""
    transport = request.transport
    if transport is None or transport in _BOUND:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError, AttributeError):  # not a TCP socket, or already closed
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STREAM_SEND_BUFFER)
    _BOUND.add(transport)


FORWARDER_KEY = web.AppKey("forwarder", Forwarder)


async def deliver(
    request: web.Request, reply: BackendReply, headers: Mapping[str, str], gateway: Gateway,
    *, on_first: Callable[[], None] | None = None,
) -> tuple[web.StreamResponse, bool]:
    """Send a backend reply to the client: whole (its status and content type), or an event stream
    relayed chunk by chunk (``on_first`` at its first chunk). Returns the response and whether it
    went out complete (False: the client went away mid-stream, or read nothing for
    ``--stream-stall-timeout`` and was cut)."""
    if reply.stream is None:
        # A backend's 500 is 502 here as on chat (``relayed_status``); its body goes as it came.
        return web.Response(body=reply.body, status=relayed_status(reply.status),
                            headers={**headers, "Content-Type": reply.content_type}), True
    head = {"Content-Type": reply.content_type, **STREAM_HEADERS, **headers}
    response = await open_stream(request, reply.status, head, arrived=reply.stream_arrived())
    return response, await relay_stream(request, response, observed_stream(reply.stream), gateway, on_first=on_first,
                                         is_last=lambda chunk: reply.stream_ended() or chunk.endswith(DONE_FRAME))


async def open_stream(request: web.Request, status: int, headers: Mapping[str, str], *, arrived: bool) -> web.StreamResponse:
    """The prepared response of an event stream, its client socket's send buffer bound: its head
    waits for the first chunk when one is ``arrived`` (one write for both), else leaves now (a
    client must not wait for the first token to see the response start)."""
    _bound_send_buffer(request)
    response = _HeadWithFirstChunk(status=status, headers=headers)
    await response.prepare(request)
    if not arrived:
        await response.write(b"")  # nothing to send with the head: the client gets it now
    return response


# The frame after which an OpenAI event stream sends nothing.
DONE_FRAME = b"data: [DONE]\n\n"
# A write that leaves the transport's buffer at most this full cannot wait for the client (asyncio's
# and uvloop's transports pause their writer above 64 KiB).
_UNBLOCKED_BYTES = 16 * 1024


class _HeadWithFirstChunk(web.StreamResponse):
    """An event stream whose head waits for the first write, so a head and a chunk that are both
    at hand leave in one write (one send on the socket, not two): aiohttp's own ``Response``
    does the same for whole bodies. ``_send_headers_immediately`` is aiohttp's, not public
    (aiohttp is pinned for it: tests/test_aiohttp_pin.py)."""

    _send_headers_immediately = False


async def relay_stream(
    request: web.Request, response: web.StreamResponse, chunks: AsyncIterator[bytes], gateway: Gateway, *,
    on_first: Callable[[], None] | None = None, error_frame: Callable[[MmgateError], bytes] = error_frame,
    is_last: Callable[[bytes], bool] | None = None,
) -> bool:
    """Relay ``chunks`` into the prepared ``response``; True when it went out complete. A backend
    error mid-stream ends it with ``error_frame`` (the API's own shape: the status is sent); a client
    that reads nothing for ``--stream-stall-timeout`` is cut, freeing the backend's connection.
    ``is_last(chunk)``: whether nothing is to follow ``chunk`` (the backend's reply has nothing
    left, ``BackendReply.stream_ended``; or the protocol sends nothing after it, ``DONE_FRAME``):
    it then leaves with the stream's end in one write, and the backend's reply is read to its end
    after (``drain``), whatever it still held not relayed."""
    first = True
    stall_s = gateway.settings.stream_stall_timeout_s
    transport = request.transport
    try:
        async for chunk in chunks:
            if first and on_first is not None:
                on_first()
            first = False
            last = is_last is not None and is_last(chunk)
            if transport is not None and transport.get_write_buffer_size() + len(chunk) <= _UNBLOCKED_BYTES:
                # Far below the transport's high-water mark the write cannot wait: no timer to arm.
                await (response.write_eof(chunk) if last else response.write(chunk))
            else:
                # A client that stops reading fills its socket and the write waits: past the stall
                # timeout the stream is cut, so its backend connection (and engine slot) is freed.
                async with asyncio.timeout(stall_s):
                    await (response.write_eof(chunk) if last else response.write(chunk))
            if last:
                await drain(chunks)
                break
    except TimeoutError:
        gateway.metrics.streams_stalled.inc()
        log.info("cut a stream whose client read nothing for %gs (--stream-stall-timeout)", stall_s)
        if request.transport is not None:
            request.transport.abort()
        return False
    except MmgateError as exc:
        # The stream has started: the status is sent, so the error travels as an SSE frame.
        log.warning("backend stream failed: %s", exc.message)
        with contextlib.suppress(ConnectionError):
            await response.write(error_frame(exc))
    except ConnectionError:
        # The client went away; the caller closes the backend stream, which tells it to stop.
        return False
    except asyncio.CancelledError:
        if gateway.stopping:
            # Cut at shutdown after the drain time: say so in the stream, end it cleanly.
            with contextlib.suppress(ConnectionError, RuntimeError):
                await response.write(error_frame(stream_cut()))
                await response.write_eof()
        raise
    try:
        await response.write_eof()
    except ConnectionError:
        return False
    return True
