"""Keep-alive connections to one backend, at most ``limit`` in use: the wait for a free one
bounded by the connect timeout, idle ones closed after the keep-alive time."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterable

from mmgate.backends.wire.errors import ConnectFailed, PoolFull
from mmgate.backends.wire.exchange import Conn, EarlyReply, Exchange, OnReply


class WirePool:
    """Keep-alive connections to one ``host:port``, at most ``limit`` in use (module docstring)."""

    def __init__(self, host: str, port: int, *, limit: int, connect_timeout_s: float, read_timeout_s: float,
                 keepalive_s: float) -> None:
        self.host = host
        self.port = port
        self.limit = limit
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.keepalive_s = keepalive_s
        self.loop = asyncio.get_running_loop()
        self._idle: list[Conn] = []  # oldest first; the newest is reused first
        self._active = 0  # connections in use or being made
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False

    @property
    def in_use(self) -> int:
        return self._active

    @property
    def idle(self) -> int:
        return len(self._idle)

    async def send(self, head: bytes, body: bytes | AsyncIterable[bytes] | None, *,
                   head_only: bool = False, on_reply: OnReply | None = None, at_head: bool = False) -> Exchange:
        """Write one request (``head``: its request line and headers, blank line included;
        ``body`` whole, or chunks sent with chunked framing) and wait for the reply's head. The
        exchange holds its connection until ``read_all`` or ``finish``."""
        conn = self._idle_conn() or await self._acquire()
        ex = Exchange(self, conn, head_only, on_reply, at_head)
        conn.ex = ex
        try:
            if not ex.write_small(head, body):  # no body or a small one: written at once
                assert body is not None
                try:
                    await ex.write(head, body)
                except EarlyReply:
                    pass  # what it answered is read next
            await ex.head()
        except BaseException:
            ex.finish()  # not complete: closed, never reused
            raise
        return ex

    def _idle_conn(self) -> Conn | None:
        """A free slot's idle connection, taken without a wait (None: ``_acquire`` it)."""
        if self._active >= self.limit or self._waiters or self._closed or not self._idle:
            return None
        conn = self._pop_idle()
        if conn is not None:
            self._active += 1
        return conn

    def _pop_idle(self) -> Conn | None:
        """The newest idle connection still good to use; those past their keep-alive are closed."""
        idle = self._idle
        now = self.loop.time()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self.keepalive_s:
                return conn
            conn.close()
        return None

    async def _acquire(self) -> Conn:
        if self._active >= self.limit or self._waiters:
            await self._wait_for_slot()
        else:
            self._active += 1
        try:
            if self._closed:
                raise ConnectFailed("the pool is closed")
            return self._pop_idle() or await self._connect()
        except BaseException:
            self._free_slot()
            raise

    async def _wait_for_slot(self) -> None:
        """Wait for a slot handed over by ``_free_slot``, at most the connect timeout."""
        waiter = self.loop.create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self._free_slot()  # handed over as the wait ended: pass it on
            else:
                waiter.cancel()
            if isinstance(exc, TimeoutError):
                raise PoolFull(f"all {self.limit} connections in use") from exc
            raise

    def _free_slot(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot goes to the longest waiter as it is
                return
        self._active -= 1

    async def _connect(self) -> Conn:
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await self.loop.create_connection(Conn, self.host, self.port)
        except TimeoutError as exc:
            raise ConnectFailed(f"no connection within {self.connect_timeout_s:g}s", timed_out=True) from exc
        except OSError as exc:
            raise ConnectFailed(str(exc) or type(exc).__name__) from exc
        return conn

    def release(self, conn: Conn, *, reuse: bool) -> None:
        if reuse and not self._closed:
            conn.idle_since = self.loop.time()
            self._idle.append(conn)
            if self._sweeper is None:
                self._sweeper = self.loop.call_later(self.keepalive_s, self._sweep)
        else:
            conn.close()
        self._free_slot()

    def _sweep(self) -> None:
        """Close the connections idle for the keep-alive time (and those the backend closed)."""
        self._sweeper = None
        deadline = self.loop.time() - self.keepalive_s
        keep = []
        for conn in self._idle:
            if conn.closed or conn.idle_since <= deadline:
                conn.close()
            else:
                keep.append(conn)
        self._idle = keep
        if keep:
            self._sweeper = self.loop.call_at(keep[0].idle_since + self.keepalive_s, self._sweep)

    def close(self) -> None:
        """Close the idle connections; those in use close when their exchange finishes."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in self._idle:
            conn.close()
        self._idle = []
