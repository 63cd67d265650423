"""One request and its reply on one pooled connection: the connection's protocol and the
exchange its parser (httptools) fills."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterable, Callable
from typing import TYPE_CHECKING

import httptools

from mmgate.backends.wire.errors import BadReply, BrokenOff, ReadTimeout, WireError, failure

if TYPE_CHECKING:
    from mmgate.backends.wire.pool import WirePool

log = logging.getLogger(__name__)
# Called with the exchange the moment its 200 reply is parsed whole, or its 200 head (``at_head``).
OnReply = Callable[["Exchange"], None]
_PAUSE_BYTES = 64 * 1024  # a stream's unread bytes past which the socket is not read
_PIECE_BYTES = 1 << 20  # a large body is written a piece at a time, waiting while the socket is full
_SMALL_BYTES = 16 * 1024  # a body up to this size is joined to the head: one send


class Conn(asyncio.Protocol):
    """One connection to the backend; ``ex`` is the exchange it is serving (None while idle)."""

    __slots__ = ("closed", "ex", "idle_since", "transport", "write_paused")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.ex: Exchange | None = None
        self.closed = False
        self.idle_since = 0.0
        self.write_paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        ex = self.ex
        if ex is None:  # bytes nobody asked for: the connection cannot be trusted again
            self.close()
            return
        ex.received(data)

    def eof_received(self) -> bool:
        return False  # close the transport; ``connection_lost`` ends the exchange

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.write_paused = False
        if self.ex is not None:
            self.ex.lost()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.ex is not None:
            self.ex.wake()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Exchange:
    """One request and its reply on one pooled connection: the parser's callbacks fill it, the
    caller reads ``status``/``content_type`` and then ``read_all``, or ``take`` and ``wait`` in turn
    (a stream: each piece as it came off the socket, never re-framed); ``finish`` gives the
    connection back (or closes it) exactly once."""

    __slots__ = ("_framed", "_interim", "_keep_alive", "_paused", "_timer", "_wait_started", "_waiter",
                 "_written", "at_head", "buffered", "chunks", "complete", "conn", "content_type", "error", "head_only",
                 "last_data", "on_reply", "parser", "pool", "status", "streaming")

    def __init__(self, pool: WirePool, conn: Conn, head_only: bool, on_reply: OnReply | None = None,
                 at_head: bool = False) -> None:
        self.pool = pool
        self.on_reply = on_reply
        self.at_head = at_head
        self.conn: Conn | None = conn
        self.parser = httptools.HttpResponseParser(self)
        self.head_only = head_only
        self.status = 0
        self.content_type: str | None = None
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.complete = False
        self.error: WireError | None = None
        self.streaming = False
        self.last_data = 0.0
        self._framed = False  # the reply says where its body ends (Content-Length or chunked)
        self._interim = False  # inside a 1xx reply, which is skipped
        self._keep_alive = False
        self._paused = False
        self._written = False
        self._timer: asyncio.TimerHandle | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._wait_started = 0.0

    # -- the parser's callbacks (httptools calls them by name) --------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered == b"content-type":
            self.content_type = value.decode("latin-1")
        elif lowered == b"content-length" or lowered == b"transfer-encoding":
            self._framed = True

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:
            self._interim = True
            return
        if self.status:  # a second reply on one request: the connection is out of step
            raise ValueError("more than one reply")
        self.status = status
        if self.head_only:
            self.complete = True

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.streaming and self.buffered > _PAUSE_BYTES and not self._paused and self.conn is not None:
            self._paused = True
            if self.conn.transport is not None:
                self.conn.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            self.content_type = None
            self._framed = False
            return
        self.complete = True
        self._keep_alive = self.parser.should_keep_alive()

    # -- the connection's events ---------------------------------------------------------------

    def received(self, data: bytes) -> None:
        self.last_data = self.pool.loop.time()
        if self.complete:  # bytes past the reply: never reuse the connection
            self._keep_alive = False
            self.wake()
            return
        try:
            self.parser.feed_data(data)
        except Exception as exc:  # httptools.HttpParserError, or a callback's refusal
            if self.complete:  # the reply is whole; what came after it is not: never reuse
                self._keep_alive = False
            else:
                self.fail(failure(BadReply, f"not an HTTP reply ({exc})", self.status != 0))
                return
        if (sink := self.on_reply) is not None and (self.complete or (self.at_head and self.status)):
            self.on_reply = None  # once
            self._early(sink)
        self.wake()

    def _early(self, sink: OnReply) -> None:
        """A 200 reply whole (or its head, ``at_head``): to ``sink`` now."""
        if self.status != 200:
            return
        try:
            sink(self)
        except Exception:  # the writer's bug: its task still gets the reply and answers
            log.exception("the early writer of a reply failed")

    def whole(self) -> bytes:
        """The body of a complete reply, joined in place (``read_all`` still returns it)."""
        chunks = self.chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks[:] = [body]
        return body

    def lost(self) -> None:
        if not self.complete and self.error is None:
            if self.status and not self._framed:
                self.complete = True  # a body that ends with the connection
            else:
                self.error = failure(BrokenOff, "the connection closed", self.status != 0)
        self._keep_alive = False
        self.wake()

    def fail(self, error: WireError) -> None:
        if self.error is None:
            self.error = error
        if self.conn is not None:
            self.conn.close()
        self.wake()

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- waiting, under the read timeout ------------------------------------------------------

    async def wait(self) -> None:
        """Until the connection has news (bytes, its end, room to write); raises the exchange's error."""
        if self.error is None:
            loop = self.pool.loop
            waiter = self._waiter = loop.create_future()
            self._wait_started = loop.time()
            if self._timer is None:
                self._timer = loop.call_at(self._wait_started + self.pool.read_timeout_s, self._on_timer)
            try:
                await waiter
            finally:
                self._waiter = None
        if self.error is not None:
            raise self.error

    def _on_timer(self) -> None:
        """The read timeout: fires only if the backend was silent all along a wait."""
        self._timer = None
        if self._waiter is None or self.conn is None:
            return  # nobody waits now; the next wait arms it again
        loop = self.pool.loop
        silent = loop.time() - max(self.last_data, self._wait_started)
        limit = self.pool.read_timeout_s
        if silent >= limit:
            self.fail(failure(ReadTimeout, f"nothing for {limit:g}s", self.status != 0))
        else:
            self._timer = loop.call_later(limit - silent, self._on_timer)

    # -- the request ----------------------------------------------------------------------------

    def write_small(self, head: bytes, body: bytes | AsyncIterable[bytes] | None) -> bool:
        """Write the request now when it is one send (no body, or a small one); False: ``write``."""
        if body is not None and (not isinstance(body, bytes) or len(body) > _SMALL_BYTES):
            return False
        conn = self.conn
        assert conn is not None and conn.transport is not None
        conn.transport.write(head if body is None else head + body)
        self._written = not conn.closed and self.error is None
        return True

    async def write(self, head: bytes, body: bytes | AsyncIterable[bytes]) -> None:
        """Write a request ``write_small`` did not: a large body a piece at a time, or chunks."""
        conn = self.conn
        assert conn is not None and conn.transport is not None
        transport = conn.transport
        transport.write(head)
        if isinstance(body, bytes):
            view = memoryview(body)
            for start in range(0, len(body), _PIECE_BYTES):
                await self._room()
                transport.write(view[start:start + _PIECE_BYTES])
        else:
            async for chunk in body:
                if chunk:
                    await self._room()
                    transport.writelines((b"%x\r\n" % len(chunk), chunk, b"\r\n"))
            await self._room()
            transport.write(b"0\r\n\r\n")
        self._written = not conn.closed and self.error is None

    async def _room(self) -> None:
        """Wait while the socket's buffer is full; an early reply or a closed connection ends the
        request (what the backend answered is read next)."""
        conn = self.conn
        while conn is not None and conn.write_paused and not self.complete:
            await self.wait()
        if self.error is not None:
            raise self.error
        if self.complete or (conn is not None and conn.closed):
            raise EarlyReply

    async def head(self) -> None:
        """Until the reply's status and headers are here."""
        while not self.status:
            await self.wait()

    async def read_all(self) -> bytes:
        """The whole body; the connection goes back to the pool."""
        while not self.complete:
            await self.wait()
        chunks = self.chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self.finish()
        return body

    def take(self) -> bytes | None:
        """What has arrived of the body and was not taken yet (None: nothing)."""
        chunks = self.chunks
        if not chunks:
            return None
        chunk = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self.buffered = 0
        if self._paused:
            self._paused = False
            if self.conn is not None and self.conn.transport is not None and not self.conn.closed:
                self.conn.transport.resume_reading()
        return chunk

    def arrived(self) -> bool:
        return bool(self.chunks) or self.complete

    def ended(self) -> bool:
        return self.complete and not self.chunks

    def finish(self) -> None:
        """Give the connection back: to the pool when the exchange ended cleanly, else closed.
        Idempotent."""
        conn = self.conn
        if conn is None:
            return
        self.conn = None
        del self.parser  # it holds this exchange: no cycle left for the garbage collector
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        conn.ex = None
        reuse = (self.complete and self._keep_alive and self._written and self.error is None and not self.chunks
                 and not self.head_only and not conn.closed)
        if self._paused and reuse and conn.transport is not None:
            conn.transport.resume_reading()
        self.pool.release(conn, reuse=reuse)


class EarlyReply(Exception):
    """The backend answered (or closed) before the request was written whole."""
