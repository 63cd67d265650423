"""Malformed HTTP from a client (a duplicate Content-Type, a broken request line) gets aiohttp's 400
and at most one DEBUG line in the log — never an ERROR with a traceback, which any client could
otherwise repeat to fill the log. Real gateway and real sim on loopback, raw sockets."""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest

from mmgate.sim.server import start_sim
from tests.support.gateway import FAST_SIM, running_gateway

MALFORMED = [
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Type: text/plain\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\nConnection: close\r\n\r\n",
]


async def raw(port: int, request: bytes) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return int(data.split(b" ")[1])


def server_errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "aiohttp.server" and (r.levelno >= logging.WARNING or r.exc_info)]


@pytest.mark.parametrize("request_bytes", MALFORMED)
async def test_gateway_logs_no_traceback_for_malformed_http(request_bytes: bytes,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="aiohttp.server")
    async with running_gateway() as gw:
        assert await raw(gw.port, request_bytes) == 400
        assert server_errors(caplog) == []
        debug = [r for r in caplog.records if r.name == "aiohttp.server" and r.levelno == logging.DEBUG]
        assert any("malformed HTTP" in r.getMessage() for r in debug)


async def test_sim_logs_no_traceback_for_malformed_http(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="aiohttp.server")
    sim = await start_sim(FAST_SIM)
    try:
        assert await raw(sim.port, MALFORMED[0]) == 400
    finally:
        await sim.stop()
    assert server_errors(caplog) == []


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        (b"Content-Encoding: gzip\r\nContent-Length: 4\r\n", b"{}{}"),  # says gzip, is not
        (b"Content-Encoding: deflate\r\nContent-Length: 4\r\n", b"\xff\xff\xff\xff"),
        (b"Content-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n", b"4\r\n{}{}\r\n0\r\n\r\n"),
    ],
)
async def test_a_compressed_body_is_a_json_415_not_a_500(headers: bytes, body: bytes) -> None:
    """Refused for its Content-Encoding before it is read (undecodable data under an accepted
    encoding is a 400: tests/api/test_compressed_body.py)."""
    async with running_gateway() as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + headers + b"Connection: close\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.2)  # the handler is reading the body when the bad bytes arrive
        writer.write(body)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        head, _, payload = data.partition(b"\r\n\r\n")
        assert head.split(b" ")[1] == b"415", data
        assert b"application/json" in head, data
        err = orjson.loads(payload)["error"]
        assert err["type"] == "invalid_request_error" and err["param"] == "Content-Encoding"
        assert "Content-Encoding" in err["message"], err


async def test_sim_answers_an_undecodable_body_with_a_json_400() -> None:
    sim = await start_sim(FAST_SIM)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", sim.port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Encoding: gzip\r\nContent-Length: 4\r\nConnection: close\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.write(b"{}{}")
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    finally:
        await sim.stop()
    head, _, payload = data.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"400", data
    assert orjson.loads(payload)["error"]["message"].startswith("Request body could not be read")
