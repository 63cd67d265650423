"""The chat lane (``mmgate.api.lane``): mmgate's own HTTP/1.1 server for POST /v1/chat/completions,
driven over raw loopback sockets against a real gateway and a real sim engine. What it takes it
serves like aiohttp's route would (keep-alive, pipelining, bodies in pieces, the body deadline,
streams in chunked framing); what it does not take goes to aiohttp with its bytes, and is answered
as before. The lane sends no ``Server`` header and aiohttp does: that is how a test tells who
answered."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from mmgate.api.lane_head import REQUEST_LINE
from mmgate.errors import InvalidRequestError
from mmgate.serve import start_gateway
from tests.support.gateway import FAST_SIM, gateway_settings, running_gateway

MODEL = "mmgate-sim-vl"
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


def body(**extra: Any) -> bytes:
    return orjson.dumps({"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}], **extra})


def chat(data: bytes, *extra: bytes) -> bytes:
    return HEAD + b"".join(extra) + b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data


async def answer(reader: asyncio.StreamReader, timeout: float = 10,
                 head: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    """One answer off a persistent connection: (status, lower-cased headers, body), the body read
    by Content-Length or de-chunked (``head``: read already)."""
    async with asyncio.timeout(timeout):
        if head is None:
            head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").strip().split("\r\n")
        headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:])}
        if headers.get("transfer-encoding") == "chunked":
            parts = []
            while True:
                size = int((await reader.readuntil(b"\r\n")).strip(), 16)
                parts.append(await reader.readexactly(size + 2))
                if size == 0:
                    break
                assert parts[-1].endswith(b"\r\n")
            data = b"".join(p[:-2] for p in parts)
        else:
            data = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(lines[0].split(" ")[1]), headers, data


@contextlib.asynccontextmanager
async def connection(port: int) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer
    finally:
        writer.close()


async def test_keep_alive_then_a_request_the_lane_does_not_take_goes_to_aiohttp() -> None:
    async with running_gateway() as gw, connection(gw.port) as (reader, writer):
        for i in range(3):
            writer.write(chat(body(), f"X-Request-Id: lane-{i}\r\n".encode()))
            status, headers, data = await answer(reader)
            assert status == 200 and orjson.loads(data)["object"] == "chat.completion"
            assert "server" not in headers and headers["x-request-id"] == f"lane-{i}"  # the lane's
            assert headers["x-mmgate-backend"] and headers["date"].endswith("GMT")
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, data = await answer(reader)
        assert status == 200 and orjson.loads(data)["status"] == "ok" and "aiohttp" in headers["server"]
        writer.write(chat(body()))  # the connection is aiohttp's now: chat still answered
        status, headers, _ = await answer(reader)
        assert status == 200 and "aiohttp" in headers["server"]


async def test_pipelined_requests_are_answered_in_order() -> None:
    async with running_gateway() as gw, connection(gw.port) as (reader, writer):
        writer.write(b"".join(chat(body(max_tokens=n), f"X-Request-Id: p{n}\r\n".encode()) for n in (1, 2, 3)))
        for n in (1, 2, 3):
            status, headers, data = await answer(reader)
            assert status == 200 and headers["x-request-id"] == f"p{n}"
            assert orjson.loads(data)["usage"]["completion_tokens"] == n


async def test_a_pipelined_request_the_lane_does_not_take_is_answered_after_the_chat() -> None:
    async with running_gateway() as gw, connection(gw.port) as (reader, writer):
        writer.write(chat(body(), b"X-Request-Id: first\r\n") + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, _ = await answer(reader)
        assert status == 200 and headers["x-request-id"] == "first" and "server" not in headers
        status, headers, data = await answer(reader)
        assert status == 200 and orjson.loads(data)["status"] == "ok" and "aiohttp" in headers["server"]


async def test_a_reply_goes_out_as_the_backend_gives_it_not_after_the_pipeline_unwinds() -> None:
    """The client has a whole 200 reply, and a stream's head, while the pipeline's steps after the
    backend's answer are still held (``EarlyReply``); the rest of the stream comes once they are
    done, and the connection serves on."""
    async with running_gateway() as gw, connection(gw.port) as (reader, writer):
        gateway = gw.gateway
        release = asyncio.Event()
        send = gateway.reuse.send

        async def held(*args: Any, **kwargs: Any) -> Any:
            result = await send(*args, **kwargs)
            await release.wait()
            return result

        gateway.reuse.send = held  # type: ignore[method-assign]
        writer.write(chat(body(max_tokens=2), b"X-Request-Id: early\r\n"))
        status, headers, data = await answer(reader, timeout=5)
        assert status == 200 and headers["x-request-id"] == "early" and "server" not in headers
        assert orjson.loads(data)["usage"]["completion_tokens"] == 2
        assert headers["x-mmgate-backend"] and headers["x-mmgate-reuse"] == "sent=0; stripped=0; referenced=0; healed=0"
        assert len(gateway.inflight) == 1  # its task is still held after the backend's answer
        release.set()  # the held task goes on (a waiter woken stays woken)
        release.clear()
        writer.write(chat(body(stream=True, max_tokens=40, ignore_eos=True), b"X-Request-Id: stream\r\n"))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)  # while the task is held
        assert head.startswith(b"HTTP/1.1 200") and b"X-Request-Id: stream" in head and b"x-mmgate-backend" in head
        assert len(gateway.inflight) == 1
        release.set()
        status, headers, data = await answer(reader, head=head)
        assert status == 200 and headers["transfer-encoding"] == "chunked" and data.endswith(b"data: [DONE]\n\n")
        events = [orjson.loads(e[6:]) for e in data.split(b"\n\n") if e.startswith(b"data: {")]
        assert sum(len(c["choices"][0]["delta"].get("content") or "") > 0 for c in events if c["choices"]) >= 30
        writer.write(chat(body(), b"X-Request-Id: after\r\n"))
        status, headers, _ = await answer(reader)
        assert status == 200 and headers["x-request-id"] == "after"
        async with asyncio.timeout(5):
            while gateway.inflight:  # its task ends just after its early answer
                await asyncio.sleep(0.01)


async def test_a_failure_after_an_early_stream_head_closes_the_connection() -> None:
    """Were the pipeline to fail after a stream's head went out early, the stream cannot be ended
    with an error answer: the connection closes instead of waiting, unended, for the next request."""
    async with running_gateway() as gw, connection(gw.port) as (reader, writer):
        send = gw.gateway.reuse.send

        async def failing(*args: Any, **kwargs: Any) -> Any:
            reply, _ = await send(*args, **kwargs)
            reply.release()
            raise InvalidRequestError("a failure after the backend answered")

        gw.gateway.reuse.send = failing  # type: ignore[method-assign]
        writer.write(chat(body(stream=True, max_tokens=40, ignore_eos=True)))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200") and b"chunked" in head
        rest = await asyncio.wait_for(reader.read(), 5)  # EOF: the connection closed
        assert not rest.endswith(b"0\r\n\r\n")  # never ended as if complete


async def test_connection_close_is_honoured() -> None:
    async with running_gateway() as gw, connection(gw.port) as (reader, writer):
        writer.write(chat(body(), b"Connection: close\r\n"))
        status, headers, _ = await answer(reader)
        assert status == 200 and headers["connection"] == "close" and "server" not in headers
        assert await asyncio.wait_for(reader.read(), 5) == b""


async def test_a_body_in_pieces_is_served_and_a_missing_body_gets_408() -> None:
    async with running_gateway(gateway_settings(body_timeout_s=0.5)) as gw:
        data = body()
        async with connection(gw.port) as (reader, writer):
            writer.write(chat(data)[:-len(data) + 5])
            await asyncio.sleep(0.1)
            writer.write(data[5:20])
            await asyncio.sleep(0.1)
            writer.write(data[20:])
            status, headers, _ = await answer(reader)
            assert status == 200 and "server" not in headers
        async with connection(gw.port) as (reader, writer):
            started = time.perf_counter()
            writer.write(chat(data)[:-10])  # ten bytes never come
            status, headers, reply = await answer(reader)
            assert status == 408 and orjson.loads(reply)["error"]["type"] == "invalid_request_error"
            assert time.perf_counter() - started < 5 and headers["connection"] == "close"
            assert await asyncio.wait_for(reader.read(), 5) == b""  # and the connection is closed


async def test_a_stream_is_chunked_around_the_backends_events() -> None:
    async with running_gateway() as gw, connection(gw.port) as (reader, writer):
        for _ in range(2):  # the connection stays usable after a stream
            writer.write(chat(body(stream=True, stream_options={"include_usage": True})))
            status, headers, data = await answer(reader)
            assert status == 200 and headers["content-type"].startswith("text/event-stream")
            assert headers["cache-control"] == "no-cache" and "server" not in headers
            events = [e for e in data.split(b"\n\n") if e]
            assert events[-1] == b"data: [DONE]"
            assert orjson.loads(events[-2][len(b"data: "):])["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize(("request_bytes", "status"), [
    # chunked request body: aiohttp reads it
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n%b\r\n0\r\n\r\n" % (len(body()), body()), 200),
    # compressed body: refused as before (no --max-inflation-ratio)
    (chat(body(), b"Content-Encoding: gzip\r\n"), 415),
    # a query string, HTTP/1.0, Expect: still chat, through aiohttp
    (chat(body()).replace(b"completions HTTP", b"completions?x=1 HTTP"), 200),
    (chat(body()).replace(b"HTTP/1.1", b"HTTP/1.0"), 200),
    (chat(body(), b"Expect: 100-continue\r\n"), None),
    # what aiohttp's parser refuses: duplicate Content-Type, no Host, a bad Content-Length
    (chat(body(), b"Content-Type: text/plain\r\n"), 400),
    (chat(body()).replace(b"Host: x\r\n", b""), 400),
    (HEAD + b"Content-Length: 1x\r\n\r\n", 400),
    (HEAD + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", 400),
    # past --max-body-bytes: 413 before the body
    (HEAD + b"Content-Length: 999999999999\r\n\r\n", 413),
    # a header line that is no header, before the head is whole: 400 at once
    (HEAD + b"this is no header\r\n", 400),
])
async def test_what_the_lane_does_not_take_is_answered_by_aiohttp(request_bytes: bytes, status: int | None) -> None:
    async with running_gateway() as gw, connection(gw.port) as (reader, writer):
        writer.write(request_bytes)
        got, headers, data = await answer(reader)
        if status is None:  # Expect: 100-continue gets its interim answer, then the real one
            assert got == 100
            got, headers, data = await answer(reader)
            status = 200
        assert got == status, data
        assert "aiohttp" in headers.get("server", ""), headers


async def test_errors_come_in_openai_shape_with_the_request_id() -> None:
    async with running_gateway() as gw, connection(gw.port) as (reader, writer):
        writer.write(chat(b"{not json", b"X-Request-Id: bad-1\r\n"))
        status, headers, data = await answer(reader)
        assert status == 400 and headers["x-request-id"] == "bad-1" and "server" not in headers
        assert orjson.loads(data)["error"]["type"] == "invalid_request_error"
        writer.write(chat(body(model="no-such-model")))
        status, _, data = await answer(reader)
        assert status == 404 and orjson.loads(data)["error"]["param"] == "model"
        writer.write(chat(body()))  # the connection is still served
        assert (await answer(reader))[0] == 200


async def test_an_idle_connection_is_closed_after_the_header_timeout() -> None:
    async with running_gateway(gateway_settings(header_timeout_s=0.5)) as gw, connection(gw.port) as (reader, writer):
        writer.write(chat(body()))
        assert (await answer(reader))[0] == 200
        started = time.perf_counter()
        assert await asyncio.wait_for(reader.read(), 5) == b""
        assert 0.3 < time.perf_counter() - started < 3


async def test_idle_lane_connections_are_displaced_at_the_connection_cap() -> None:
    async with running_gateway(gateway_settings(max_connections=4)) as gw:
        idle = []
        for _ in range(4):
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            writer.write(chat(body()))
            assert (await answer(reader))[0] == 200
            idle.append((reader, writer))
        async with connection(gw.port) as (reader, writer):  # a fifth: the oldest idle one makes room
            writer.write(chat(body()))
            assert (await answer(reader))[0] == 200
        assert await asyncio.wait_for(idle[0][0].read(), 5) == b""
        metrics = gw.gateway.metrics.registry.get_sample_value("mmgate_edge_connections_total", {"event": "displaced"})
        assert metrics == 1
        for _, w in idle:
            w.close()


async def test_idle_connections_close_at_shutdown() -> None:
    gw = await start_gateway(gateway_settings(), sim_settings=FAST_SIM)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(chat(body()))
        assert (await answer(reader))[0] == 200
    finally:
        await gw.stop()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()


def mutated_head(rng: random.Random) -> bytes:
    """A chat request whose head has a few random bytes changed, inserted or cut (its body valid)."""
    data = body()
    request = bytearray(chat(data, b"X-Session-Id: s-1\r\nAuthorization: Bearer k\r\n"))
    head_end = request.find(b"\r\n\r\n")
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(REQUEST_LINE), head_end)
        action = rng.random()
        junk = bytes([rng.choice(b"\x00\r\n\t :;,\"\\\x7f\x80\xff" + bytes(range(0x20, 0x7f)))])
        if action < 0.4:
            request[at:at + 1] = junk
        elif action < 0.8:
            request[at:at] = junk
        else:
            del request[at]
    return bytes(request)


async def test_mutated_heads_get_an_answer_never_a_500_and_the_gateway_serves_on(
        caplog: pytest.LogCaptureFixture) -> None:
    """Garbage in the head of a chat request, on the boundary between the lane's parser and
    aiohttp's: every one gets a 2xx/4xx answer or a close (never a 5xx, never a hang past the
    deadline), nothing is logged as an error, and a normal request is served after them all."""
    rng = random.Random(23)
    statuses: dict[int, int] = {}
    async with running_gateway(gateway_settings(header_timeout_s=1.0, body_timeout_s=1.0)) as gw:
        for _ in range(150):
            async with connection(gw.port) as (reader, writer):
                writer.write(mutated_head(rng))
                try:
                    status, _, _ = await answer(reader, timeout=5)
                except (asyncio.IncompleteReadError, ConnectionError, ValueError):
                    status = 0  # closed without an answer (a head cut short waits for its deadline)
                assert status < 500, status
                statuses[status] = statuses.get(status, 0) + 1
        async with connection(gw.port) as (reader, writer):
            writer.write(chat(body()))
            assert (await answer(reader))[0] == 200
    assert statuses.get(400, 0) > 20 and statuses.get(200, 0) > 5, statuses  # both sides were reached
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
