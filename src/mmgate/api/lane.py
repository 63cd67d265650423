"""The chat lane: mmgate's own HTTP/1.1 server for ``POST /v1/chat/completions``, beside aiohttp.

Measured side by side with vllm-router (docs/PERFORMANCE.md, "Beside vllm-router"), about half of
the latency a text request spent in the gateway was aiohttp's server: its protocol, request and
response objects and a task per request. The lane serves the one request agents send on every turn
with an asyncio protocol on ``httptools``' parser, and hands everything else to aiohttp.

Every client connection starts in the lane (``ChatLane.connection``, called by ``ConnectionGuard``
after its cap). For each request it reads the head (up to ``\\r\\n\\r\\n``) and keeps it if it is
``POST /v1/chat/completions`` over HTTP/1.1 with a ``Content-Length`` body of at most
``--max-body-bytes``, no ``Transfer-Encoding``, ``Content-Encoding``, ``Expect`` or ``Upgrade``.
Anything else — another path or method, a chunked or compressed body, a malformed or oversized
head, a bare-LF head — is handed over with every byte of that request to aiohttp's handler
(as the front door hands connections over), which serves the connection from then on and gives
malformed HTTP its precise 400. The lane itself answers nothing but chat requests.

Its duties are those of the aiohttp route (``mmgate.api.lane_serve``): request id, record, access
log and tenant metrics (``Observer.finish``), API keys and tenant slots (``admitted``), the route's
metrics, in-flight set and 499s (``tracked``), the body deadline (408), the stream stall cut, a
client that goes away cancels its request (aiohttp's ``handler_cancellation``). Here: keep-alive
with an idle deadline (``--header-timeout``, aiohttp's keep-alive timer), read-ahead of a
pipelined request bounded (reading pauses), back-pressure on writes, shutdown (idle connections
close, busy ones after their answer). With tracing on, every request goes to aiohttp (its spans
live in the observer's middleware).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from mmgate.api.lane_head import MAX_HEAD_BYTES, REQUEST_LINE, parse_head
from mmgate.api.lane_serve import serve
from mmgate.frontdoor import lines_valid

# Bytes of a pipelined next request read while one is served; then reading pauses.
READ_AHEAD_BYTES = 64 * 1024

if TYPE_CHECKING:
    from mmgate.api.gateway import Gateway
    from mmgate.api.tenant_slots import TenantSlots
    from mmgate.observe.middleware import Observer


class ChatLane:
    """What the lane's connections share, and the set of them (module docstring)."""

    def __init__(self, gateway: Gateway, observer: Observer, slots: TenantSlots | None,
                 admin_key: str | None) -> None:
        self.gateway = gateway
        self.observer = observer
        self.slots = slots
        self.admin_key = admin_key
        self.connections: dict[LaneConnection, None] = {}  # insertion order: oldest first
        self.stopping = False
        self._sweep: asyncio.TimerHandle | None = None

    def watch(self) -> None:
        """Make sure the idle sweep runs (once a connection waits)."""
        if self._sweep is None:
            timeout = self.gateway.settings.header_timeout_s
            self._sweep = asyncio.get_running_loop().call_later(min(1.0, timeout / 4), self._swept)

    def _swept(self) -> None:
        """Close every connection idle for ``--header-timeout`` (aiohttp's keep-alive timer: also
        the wait for a new connection's first head); again while any is open. One timer for all
        connections, not one armed and cancelled per request."""
        self._sweep = None
        oldest = asyncio.get_running_loop().time() - self.gateway.settings.header_timeout_s
        for conn in [c for c in self.connections if c.idle_since is not None and c.idle_since <= oldest]:
            conn.close()
        if self.connections:
            self.watch()

    def connection(self, fallback: Callable[[], asyncio.Protocol]) -> LaneConnection:
        """A new client connection; ``fallback`` makes the aiohttp handler it may be handed to."""
        return LaneConnection(self, fallback)

    def idle(self, *, fresh: bool) -> LaneConnection | None:
        """The oldest connection not inside a request (``fresh``: that never sent one)."""
        return next((c for c in self.connections if c.idle and (not fresh or c.served == 0)), None)

    def pre_shutdown(self) -> None:
        """Idle connections close now, busy ones after their answer."""
        self.stopping = True
        for conn in list(self.connections):
            if conn.idle:
                conn.close()

    def close(self) -> None:
        """Every connection still open is cut."""
        for conn in list(self.connections):
            conn.abort()
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None


class LaneConnection(asyncio.Protocol):
    """One client connection while the lane serves it (module docstring)."""

    def __init__(self, lane: ChatLane, fallback: Callable[[], asyncio.Protocol]) -> None:
        self.lane = lane
        # Looked up once: in Python 3.11 every get_running_loop() is a getpid() system call.
        self.loop = asyncio.get_running_loop()
        self._fallback = fallback
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self.task: asyncio.Task[None] | None = None
        self._body: asyncio.Future[list[bytes]] | None = None
        self._body_chunks: list[bytes] = []
        self._body_left = 0
        self.idle_since: float | None = None  # loop time this connection became idle (None: busy)
        self._reading_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._writing_paused = False
        self.served = 0
        self.closing = False  # close once the answer in progress is out
        self.lost = False
        self.bytes_out = 0
        self.buffer_bound = False  # the send buffer set for event streams (bind_stream_buffer)

    @property
    def idle(self) -> bool:
        return self.task is None  # a body still arriving belongs to a request in progress

    @property
    def body_pending(self) -> bool:
        """The request being served has not sent its whole body."""
        return self._body is not None

    @property
    def body_received(self) -> int:
        return sum(len(c) for c in self._body_chunks)

    @property
    def writing_paused(self) -> bool:
        return self._writing_paused

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.lane.connections[self] = None
        self._idle()

    def data_received(self, data: bytes) -> None:
        if self._body is not None:
            self._take_body(data)
        elif self.task is None and not self._buf:
            self._next(data)  # the common case: a whole request, or its head, in one read
            return
        else:
            self._buf += data
        if self.task is None:
            self._next(bytes(self._buf))
        elif len(self._buf) > READ_AHEAD_BYTES and not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        return False  # the client sends no more: close once the transport is done

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.lane.connections.pop(self, None)
        if self.task is not None:
            self.task.cancel()  # the client went away: its backend request ends (handler_cancellation)
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)  # the writer waiting sees the loss

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    # Requests

    def _next(self, data: bytes) -> None:
        """With no request in progress and ``data`` the bytes read past the last one: serve the
        next request whose head is whole, hand the connection to aiohttp if it is not the lane's,
        or wait for more."""
        end = data.find(b"\r\n\r\n")
        if end < 0:
            self._buf = bytearray(data)
            # Not whole yet: aiohttp's at once if it is no chat request, or no HTTP (its parser
            # answers that now, not at the deadline), or too long, or bare-LF.
            if not REQUEST_LINE.startswith(data[:len(REQUEST_LINE)]) or len(data) >= MAX_HEAD_BYTES \
                    or data.find(b"\n\n") >= 0 or not lines_valid(self._buf, 0):
                self._hand_off()
            return
        lane = self.lane
        head = parse_head(data[:end + 4], lane.gateway.settings.max_body_bytes) \
            if data.startswith(REQUEST_LINE) and not lane.stopping else None
        if head is None:
            self._buf = bytearray(data)
            self._hand_off()
            return
        self.idle_since = None
        start = end + 4
        stop = start + head.length
        body: bytes | asyncio.Future[list[bytes]]
        if len(data) >= stop:  # the whole body is here
            body = data[start:stop]
            self._buf = bytearray(data[stop:]) if len(data) > stop else bytearray()
        else:
            self._buf = bytearray()
            body = self._body = self.loop.create_future()
            self._body_chunks = []
            self._body_left = head.length
            self._take_body(data[start:])
        self.task = self.loop.create_task(serve(self, head, body))  # it calls ``request_done`` as it ends

    def _take_body(self, data: bytes) -> None:
        """Body bytes of the request being served; past its end, the next request's."""
        body = self._body
        assert body is not None
        if len(data) > self._body_left:
            self._buf += data[self._body_left:]
            data = data[:self._body_left]
        if data:
            self._body_chunks.append(data)
            self._body_left -= len(data)
        if self._body_left == 0:
            self._body = None
            if not body.done():
                body.set_result(self._body_chunks)
            self._body_chunks = []

    def request_done(self) -> None:
        """The request's task is ending (its last step: called from ``serve``, not as a done
        callback, which would take another turn of the event loop per request)."""
        self.task = None
        self.served += 1
        self.bytes_out = 0
        transport = self.transport
        if transport is None or self.lost:
            return
        if self._body is not None or self.closing or self.lane.stopping:
            # Answered before its body was read (a 401, a 408), or closing: the connection ends.
            self._body = None
            transport.close()
            return
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        self._idle()
        if self._buf:
            self._next(bytes(self._buf))

    def _hand_off(self) -> None:
        """aiohttp serves this connection from here on, starting with the bytes read so far."""
        transport = self.transport
        assert transport is not None
        self.lane.connections.pop(self, None)
        inner = self._fallback()
        inner.connection_made(transport)
        transport.set_protocol(inner)
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        data, self._buf = bytes(self._buf), bytearray()
        if data and not transport.is_closing():
            inner.data_received(data)

    # Writing, for lane_serve

    def send(self, data: bytes) -> None:
        """Write ``data``; ConnectionResetError when the client is gone."""
        transport = self.transport
        if self.lost or transport is None or transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        transport.write(data)
        self.bytes_out += len(data)

    async def drained(self) -> None:
        """Return once the transport takes writes again (at once unless it paused them)."""
        if not self._writing_paused:
            return
        if self._drain is None or self._drain.done():
            self._drain = self.loop.create_future()
        await asyncio.shield(self._drain)
        if self.lost:
            raise ConnectionResetError("the client closed the connection")

    # Ending

    def _idle(self) -> None:
        """Between requests: closed by the lane's sweep ``--header-timeout`` from now."""
        self.idle_since = self.loop.time()
        self.lane.watch()

    def close(self) -> None:
        """Close once what is written is sent; out of the lane's count at once."""
        self.lane.connections.pop(self, None)
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        self.lane.connections.pop(self, None)
        if self.transport is not None:
            self.transport.abort()
