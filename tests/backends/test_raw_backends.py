"""``HTTPBackend`` (aiohttp's client) against raw TCP servers on loopback that answer as scripted:
chunked and Content-Length bodies, a body ended by the connection, a stall before the head and one
mid-stream, a close mid-stream, garbage, and hostile replies: an endless header value or header
list, an endless body, a flood of interim replies, a reply nobody asked for. Each failure is a
gateway error, none waits past its deadline or holds the event loop, and no connection stays held
(the backend's count of connections in use is back to 0 after each)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from mmgate.backends import HTTPBackend
from mmgate.errors import (
    BackendBusyError,
    BackendConnectError,
    BackendProtocolError,
    BackendTimeoutError,
)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
FRAMES = [b'data: {"i":0}\n\n', b'data: {"i":1}\n\n', b"data: [DONE]\n\n"]
READ_S = 0.4


class Server:
    """A raw server: ``handler`` answers each request; ``connections`` counts accepted ones."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.url = ""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                self.requests.append(head + await reader.readexactly(length))
                await self.handler(reader, writer)
                if writer.is_closing():
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[Server]:
    server = Server(handler)
    listener = await asyncio.start_server(server._serve, "127.0.0.1", 0)
    server.url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    try:
        yield server
    finally:
        listener.close()


def make(url: str, **kw: object) -> HTTPBackend:
    options: dict[str, object] = {"connect_timeout_s": 0.5, "read_timeout_s": READ_S, **kw}
    return HTTPBackend("b", "vllm", url, **options)  # type: ignore[arg-type]


def in_use(b: HTTPBackend) -> int:
    """Requests that hold (or wait for) one of ``b``'s connections."""
    return b._in_use


def chunked(frames: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(f), f) for f in frames) + b"0\r\n\r\n"


SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


async def test_chunked_stream_arrives_unchanged_and_its_connection_is_reused() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD)
        for frame in FRAMES:
            await asyncio.sleep(0.02)  # each frame its own packet
            writer.write(b"%x\r\n%s\r\n" % (len(frame), frame))
        writer.write(b"0\r\n\r\n")

    async with serving(answer) as server:
        b = make(server.url)
        for _ in range(3):
            reply = await b.chat(b'{"stream":true}', stream=True)
            assert reply.status == 200 and reply.content_type == "text/event-stream" and reply.stream is not None
            chunks = [c async for c in reply.stream]
            assert b"".join(chunks) == b"".join(FRAMES) and chunks == FRAMES  # no re-framing, none merged
            assert reply.stream_ended()
            reply.release()
            reply.release()  # idempotent
            assert in_use(b) == 0
        assert server.connections == 1
        assert server.requests[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
        await b.close()


async def test_content_length_body_and_a_body_ended_by_the_close() -> None:
    replies = [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{\"a\":1}",
               b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"until\":\"close\"}"]

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(replies[min(len(server.requests), 2) - 1])
        if len(server.requests) == 2:
            await writer.drain()
            writer.close()

    async with serving(answer) as server:
        b = make(server.url)
        reply = await b.chat(b"{}", stream=False)
        assert (reply.status, reply.body) == (200, b'{"a":1}')
        reply = await b.chat(b"{}", stream=True)  # asked to stream, answered JSON: whole
        assert (reply.status, reply.body, reply.stream) == (200, b'{"until":"close"}', None)
        assert in_use(b) == 0
        await b.close()


async def test_error_status_is_read_whole_and_keeps_the_connection() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = b'{"error":{"message":"nope"}}'
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))

    async with serving(answer) as server:
        b = make(server.url)
        for _ in range(2):
            reply = await b.chat(b"{}", stream=True)
            assert reply.status == 400 and reply.stream is None and reply.body == b'{"error":{"message":"nope"}}'
        assert server.connections == 1 and in_use(b) == 0
        await b.close()


async def test_silence_before_the_head_is_a_timeout_within_the_read_timeout() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(30)

    async with serving(answer) as server:
        b = make(server.url)
        started = time.monotonic()
        with pytest.raises(BackendTimeoutError) as info:
            await b.chat(b"{}", stream=False)
        assert READ_S <= time.monotonic() - started < READ_S + 1.0
        assert info.value.status == 504 and str(info.value.message).endswith("timed out before answering")
        assert in_use(b) == 0
        await b.close()


async def test_a_stream_that_stalls_times_out_mid_stream_and_frees_its_connection() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD + b"%x\r\n%s\r\n" % (len(FRAMES[0]), FRAMES[0]))
        await asyncio.sleep(30)

    async with serving(answer) as server:
        b = make(server.url)
        reply = await b.chat(b"{}", stream=True)
        assert reply.stream is not None
        got = []
        started = time.monotonic()
        with pytest.raises(BackendTimeoutError) as info:
            async for chunk in reply.stream:
                got.append(chunk)
        assert got == [FRAMES[0]] and time.monotonic() - started < READ_S + 1.0
        assert str(info.value.message).endswith("timed out mid-stream")
        reply.release()
        assert in_use(b) == 0
        await b.close()


async def test_a_slow_but_steady_stream_is_not_a_timeout() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD)
        for _ in range(6):  # 6 x 0.24 s: longer than the read timeout in all, never silent that long
            await asyncio.sleep(READ_S * 0.6)
            writer.write(b"%x\r\n%s\r\n" % (len(FRAMES[0]), FRAMES[0]))
        writer.write(b"0\r\n\r\n")

    async with serving(answer) as server:
        b = make(server.url)
        reply = await b.chat(b"{}", stream=True)
        assert reply.stream is not None
        assert b"".join([c async for c in reply.stream]) == FRAMES[0] * 6
        await b.close()


@pytest.mark.parametrize("answered", [False, True])
async def test_a_close_before_or_during_the_reply(answered: bool) -> None:
    """Closed before any byte of the reply: unreachable (502, another backend may take it);
    after the head: the answer broke off (502 protocol error)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if answered:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 1000\r\n\r\n"
                         + FRAMES[0])
            await writer.drain()
        writer.close()

    async with serving(answer) as server:
        b = make(server.url)
        if not answered:
            with pytest.raises(BackendConnectError) as info:
                await b.chat(b"{}", stream=True)
            assert info.value.code == "backend_unreachable"
        else:
            reply = await b.chat(b"{}", stream=True)
            assert reply.stream is not None
            with pytest.raises(BackendProtocolError) as broke:
                async for _ in reply.stream:
                    pass
            assert broke.value.status == 502 and str(broke.value.message).endswith("mid-stream")
            reply.release()
            with pytest.raises(BackendProtocolError):  # the same, read whole
                await b.chat(b"{}", stream=False)
        assert in_use(b) == 0
        await b.close()


@pytest.mark.parametrize("garbage", [b"SMTP READY\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
                                     b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"])
async def test_garbage_is_a_protocol_error(garbage: bytes) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(garbage)
        await asyncio.sleep(5)

    async with serving(answer) as server:
        b = make(server.url)
        started = time.monotonic()
        with pytest.raises(BackendProtocolError) as info:
            await b.chat(b"{}", stream=False)
        assert info.value.code == "backend_protocol_error" and time.monotonic() - started < READ_S
        assert in_use(b) == 0
        await b.close()


async def test_a_full_pool_is_busy_and_a_freed_connection_goes_to_the_waiter() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(server.requests) == 1:  # a stream that goes on: its connection stays held
            writer.write(SSE_HEAD + b"%x\r\n%s\r\n" % (len(FRAMES[0]), FRAMES[0]))
        else:
            writer.write(SSE_HEAD + chunked(FRAMES))

    async with serving(answer) as server:
        b = make(server.url, max_connections=1, read_timeout_s=5.0)
        held = await b.chat(b"{}", stream=True)  # holds the one connection until released
        started = time.monotonic()
        with pytest.raises(BackendBusyError) as info:
            await b.chat(b"{}", stream=False)
        assert info.value.status == 503 and 0.5 <= time.monotonic() - started < 1.5
        waiting = asyncio.ensure_future(b.chat(b"{}", stream=False))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        held.release()  # unread: closed, and its slot goes to the waiter
        assert (await waiting).status == 200
        assert in_use(b) == 0 and server.connections == 2
        await b.close()


async def test_a_cancelled_request_and_an_unread_stream_leave_nothing_held() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(server.requests) == 1:
            await asyncio.sleep(30)
        writer.write(SSE_HEAD + b"%x\r\n%s\r\n" % (len(FRAMES[0]), FRAMES[0]))

    async with serving(answer) as server:
        b = make(server.url, read_timeout_s=30.0)
        task = asyncio.ensure_future(b.chat(b"{}", stream=True))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert in_use(b) == 0
        reply = await b.chat(b"{}", stream=True)  # a stream left after its first chunk
        assert reply.stream is not None
        assert await reply.stream.__anext__() == FRAMES[0]
        reply.release()
        assert in_use(b) == 0
        await b.close()


async def test_a_reply_asking_to_close_is_not_reused() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}")

    async with serving(answer) as server:
        b = make(server.url)
        for _ in range(2):
            assert (await b.chat(b"{}", stream=False)).body == b"{}"
        assert server.connections == 2 and in_use(b) == 0
        await b.close()


async def test_a_large_stream_read_slowly_is_relayed_whole() -> None:
    """Back-pressure: the client stops reading the socket while the caller lags, and resumes."""
    frame = b"data: " + b"x" * 4000 + b"\n\n"

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD)
        for _ in range(200):
            writer.write(b"%x\r\n%s\r\n" % (len(frame), frame))
            await writer.drain()
        writer.write(b"0\r\n\r\n")

    async with serving(answer) as server:
        b = make(server.url, read_timeout_s=5.0)
        reply = await b.chat(b"{}", stream=True)
        assert reply.stream is not None
        total = 0
        async for chunk in reply.stream:
            total += len(chunk)
            await asyncio.sleep(0.001)
        assert total == 200 * len(frame)
        await b.close()


async def test_a_request_line_and_headers_cannot_be_broken() -> None:
    """A path with a space or non-ASCII is escaped as aiohttp's URL would; a header value with a
    line break is refused before anything is sent."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")

    async with serving(answer) as server:
        b = make(server.url)
        reply = await b.request("GET", "/v1/models/a b/\u00e9?x=1%202")
        assert reply.status == 200
        assert server.requests[0].startswith(b"GET /v1/models/a%20b/%C3%A9?x=1%202 HTTP/1.1\r\n")
        with pytest.raises(ValueError):
            await b.request("GET", "/x", headers={"Accept": "a\r\nX-Injected: 1"})
        assert len(server.requests) == 1 and in_use(b) == 0
        await b.close()


async def test_idle_connections_are_closed_after_the_keepalive_without_another_request() -> None:
    closed = asyncio.Event()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()
        if not await reader.read(1):  # the client closed its end
            closed.set()
            writer.close()

    async with serving(answer) as server:
        b = make(server.url, keepalive_s=0.2)
        assert (await b.chat(b"{}", stream=False)).status == 200
        await asyncio.wait_for(closed.wait(), 3.0)  # the sweep closed it
        assert server.connections == 1
        await b.close()


class LoopWatch:
    """The longest the event loop went without running a 10 ms ticker: a callback that holds the
    loop (a parse of a huge head) shows as a long gap."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            self.longest = max(self.longest, now - last)
            last = now

    def __enter__(self) -> LoopWatch:
        self._task = asyncio.ensure_future(self._tick())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def _endless(writer: asyncio.StreamWriter, piece: bytes, *, seconds: float = 10.0) -> None:
    """Write ``piece`` over and over for ``seconds`` or until the client closes."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not writer.is_closing():
        writer.write(piece)
        await writer.drain()


@pytest.mark.parametrize("endless", [b"x" * 65536, b"X-Again: 1\r\n" * 4096], ids=["header value", "header lines"])
async def test_an_endless_reply_head_is_refused_at_the_head_limits(endless: bytes) -> None:
    """An endless header value, or endless header lines: 502 at aiohttp's head limits (a line of
    ``MAX_HEAD_LINE_BYTES``, ``MAX_HEADERS`` lines: ``mmgate.backends.session``), the loop never held.
    (The lean client had no limit: in a trial neither had an answer after 6 s; the value took 164 MiB.)"""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Long: ")
        with contextlib.suppress(ConnectionError):
            await _endless(writer, endless)

    async with serving(answer) as server:
        b = make(server.url, read_timeout_s=5.0)
        started = time.monotonic()
        with LoopWatch() as watch:
            with pytest.raises(BackendProtocolError) as info:
                await b.chat(b"{}", stream=False)
        assert info.value.status == 502 and time.monotonic() - started < 1.0
        assert watch.longest < 0.2
        assert in_use(b) == 0
        await b.close()


@pytest.mark.parametrize("framing", ["chunked", "declared", "until close"])
async def test_a_non_streamed_body_past_the_reply_cap_is_502_and_read_no_further(framing: str) -> None:
    """An endless body (chunked, or ended by a close that never comes) is read up to
    ``--max-backend-reply-bytes`` and no further: 502, its connection closed (the lean client read
    on: no answer after 6 s in a trial); a declared length past the cap is refused before a byte
    of the body is read."""
    cap = 1 << 20
    sent = 0

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        framing_header = {"chunked": b"Transfer-Encoding: chunked\r\n",
                          "declared": b"Content-Length: %d\r\n" % (1 << 40), "until close": b""}[framing]
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + framing_header + b"\r\n")
        piece = b"%x\r\n%s\r\n" % (65536, b"a" * 65536) if framing == "chunked" else b"a" * 65536
        deadline = time.monotonic() + 10
        with contextlib.suppress(ConnectionError):
            while time.monotonic() < deadline and not writer.is_closing():
                writer.write(piece)
                sent += len(piece)
                await writer.drain()

    async with serving(answer) as server:
        b = make(server.url, read_timeout_s=5.0, max_reply_bytes=cap)
        started = time.monotonic()
        with pytest.raises(BackendProtocolError) as info:
            await b.chat(b"{}", stream=False)
        assert info.value.status == 502 and "--max-backend-reply-bytes" in info.value.message
        assert time.monotonic() - started < 2.0
        assert in_use(b) == 0
        await asyncio.sleep(0.3)
        assert sent < 64 * cap  # the connection was closed: the backend could not write on for ever
        await b.close()


async def test_a_whole_read_cancelled_by_a_departing_client_frees_its_connection() -> None:
    """A client that leaves while a large body arrives cancels the read: the connection is
    closed (the backend sees it) and nothing of the body is kept."""
    closed = asyncio.Event()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000000\r\n\r\n")
        with contextlib.suppress(ConnectionError):
            for _ in range(200):
                writer.write(b"a" * 65536)
                await writer.drain()
                await asyncio.sleep(0.01)
        closed.set()

    async with serving(answer) as server:
        b = make(server.url, read_timeout_s=5.0)
        task = asyncio.ensure_future(b.chat(b"{}", stream=False))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert in_use(b) == 0
        await asyncio.wait_for(closed.wait(), 3.0)
        await b.close()


async def test_a_flood_of_interim_replies_does_not_hold_a_request_past_its_deadline() -> None:
    """``102 Processing`` every 50 ms (each resets a read timeout): the whole answer's deadline
    (``--backend-reply-timeout``) still ends the request, 504 (the lean client waited for ever)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            for _ in range(400):
                writer.write(b"HTTP/1.1 102 Processing\r\n\r\n")
                await writer.drain()
                await asyncio.sleep(0.05)

    async with serving(answer) as server:
        b = make(server.url, read_timeout_s=5.0, reply_timeout_s=1.0)
        for stream in (False, True):
            started = time.monotonic()
            with pytest.raises(BackendTimeoutError) as info:
                await b.chat(b"{}", stream=stream)
            assert info.value.status == 504 and 1.0 <= time.monotonic() - started < 2.0
        assert in_use(b) == 0
        await b.close()


async def test_a_reply_nobody_asked_for_never_reaches_the_next_request() -> None:
    """The backend answers the first request, then sends a second reply on the idle pooled
    connection: the next request must get its own answer, on another connection. aiohttp's pool
    alone hands the stray reply to whoever asks next (tried: the second request got the stray
    body); the lean client closed such a connection itself, so this guards the move to aiohttp."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = len(server.requests)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 8\r\n\r\n"
                     b'{"n":%d}' % n + b" " * (8 - len(b'{"n":%d}' % n)))
        if n == 1:
            await writer.drain()
            await asyncio.sleep(0.05)
            stray = b'{"stray":true}'
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(stray), stray))

    async with serving(answer) as server:
        b = make(server.url)
        assert (await b.chat(b"{}", stream=False)).body == b'{"n":1}'.ljust(8)
        await asyncio.sleep(0.2)  # the stray reply is in
        for expected in (2, 3):
            assert (await b.chat(b"{}", stream=False)).body == b'{"n":%d}' % expected + b" " * (8 - len(b'{"n":2}'))
        assert server.connections == 2 and in_use(b) == 0  # the stray one closed, the next reused
        await b.close()
