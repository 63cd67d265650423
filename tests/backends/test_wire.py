"""The lean backend client (``mmgate.backends.wire``, through ``HTTPBackend``) against raw TCP
servers on loopback that answer as scripted: chunked and Content-Length bodies, a body ended by
the connection, a stall before the head and one mid-stream, a close mid-stream, garbage. Each
failure is the gateway error aiohttp's client gave, none waits past its timeout, and no pooled
connection leaks (the pool's count of connections in use is back to 0 after each)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from mmgate.backends import HTTPBackend
from mmgate.backends.base import set_early_reply
from mmgate.backends.wire import WirePool
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


def pool(b: HTTPBackend) -> WirePool:
    assert b._lean is not None and b._lean.pool is not None
    return b._lean.pool


def in_use(b: HTTPBackend) -> int:
    return pool(b).in_use


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
            assert in_use(b) == 0  # the stream's end gave the connection back, before any release
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
        assert in_use(b) == 0 and pool(b).idle == 0  # that one is not reused
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


class Early:
    """An early writer (``EarlyReply``) that records what it was given, and when."""

    def __init__(self, backend: HTTPBackend, *, fail: bool = False) -> None:
        self.headers: dict[str, str] | None = {"x-mmgate-backend": "b"}
        self.backend = backend
        self.fail = fail
        self.written: list[tuple[str | None, bytes, int]] = []
        self.streams: list[tuple[str | None, bytes | None, bool]] = []

    def write_whole(self, content_type: str | None, body: bytes) -> None:
        self.written.append((content_type, body, in_use(self.backend)))  # the connection still held
        if self.fail:
            raise RuntimeError("a bug of the writer")

    def write_stream(self, content_type: str | None, chunk: bytes | None, ended: bool) -> None:
        self.streams.append((content_type, chunk, ended))


async def test_a_200_goes_to_the_early_writer_as_it_is_parsed_and_nothing_else_does() -> None:
    body = b'{"id":"x","choices":[]}'
    replies = {b'{"n":200}': b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
               % (len(body), body),
               b'{"n":400}': b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
               b'{"n":"sse"}': SSE_HEAD + chunked(FRAMES),
               b'{"n":"sse in one"}': SSE_HEAD + chunked(FRAMES)}

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        asked = server.requests[-1].rsplit(b"\r\n\r\n", 1)[1]
        reply = replies[asked]
        cut = len(reply) if asked == b'{"n":"sse in one"}' else len(SSE_HEAD) if asked == b'{"n":"sse"}' else 40
        writer.write(reply[:cut])  # in two reads (the stream: its head alone, then its events)
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(reply[cut:])

    async with serving(answer) as server:
        b = make(server.url)
        early = Early(b)
        set_early_reply(early)
        try:
            reply = await b.chat(b'{"n":200}', stream=False)
            assert reply.body == body and early.written == [("application/json", body, 1)]
            reply = await b.chat(b'{"n":400}', stream=False)  # an error: the pipeline's to answer
            assert reply.status == 400 and len(early.written) == 1 and not early.streams
            reply = await b.chat(b'{"n":"sse"}', stream=True)  # its head at once; the events relayed
            assert early.streams == [("text/event-stream", None, False)]
            assert reply.stream is not None and b"".join([c async for c in reply.stream]) == b"".join(FRAMES)
            reply = await b.chat(b'{"n":"sse in one"}', stream=True)  # head, events and end in one read
            assert early.streams[1] == ("text/event-stream", b"".join(FRAMES), True)
            assert reply.stream is not None and [c async for c in reply.stream] == []
            reply = await b.chat(b'{"n":200}', stream=True)  # asked to stream, answered whole: not early
            assert reply.body == body and len(early.written) == 1 and len(early.streams) == 2
            failing = Early(b, fail=True)
            set_early_reply(failing)
            reply = await b.chat(b'{"n":200}', stream=False)  # a writer that raises: the reply still comes back
            assert reply.body == body and len(failing.written) == 1
        finally:
            set_early_reply(None)
        assert server.connections == 1 and in_use(b) == 0  # every connection back, none broken
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
        assert in_use(b) == 0 and pool(b).idle == 0
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
            assert str(broke.value.message).endswith("broke off mid-stream")
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
        assert in_use(b) == 0 and pool(b).idle == 0
        await b.close()


async def test_a_full_pool_is_busy_and_a_freed_connection_goes_to_the_waiter() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
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
        assert in_use(b) == 0 and pool(b).idle == 0
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
        assert pool(b).idle == 1
        await asyncio.wait_for(closed.wait(), 2.0)  # the sweep closed it
        assert pool(b).idle == 0 and server.connections == 1
        await b.close()
