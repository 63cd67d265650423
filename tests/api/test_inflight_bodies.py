"""Request bodies held at once are bounded in bytes (``--max-body-bytes-in-flight``): a real
``mmgate serve`` process, clients on raw loopback sockets holding half-sent bodies."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import orjson

from tests.api.test_edge import BODY, CHAT, chat_ok, exchange
from tests.support.serve_process import serve_process

LIMIT = 1_000_000


async def _hold(port: int, sent: int, declared: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that sent its head and ``sent`` bytes of a ``declared``-byte body, then waits."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(CHAT + f"Content-Length: {declared}\r\n\r\n".encode() + b" " * sent)
    await writer.drain()
    return reader, writer


async def test_bodies_past_the_limit_are_refused_until_the_held_ones_end(tmp_path: Path) -> None:
    with serve_process(tmp_path, "--max-body-bytes-in-flight", str(LIMIT), "--max-body-bytes", "4000000") as gw:
        # Announced but not sent holds nothing: many such clients do not shut others out.
        idle = [await _hold(gw.port, 0, 3_000_000) for _ in range(5)]
        await chat_ok(gw.url)
        # One client alone may send more than the limit (its body is bounded by --max-body-bytes).
        big = await _hold(gw.port, 1_500_000, 3_000_000)
        await asyncio.sleep(0.5)  # read by the gateway: 1.5 MB held
        status, headers, body = await exchange(
            gw.port, CHAT + f"Content-Length: {200_000}\r\n\r\n".encode() + b" " * 200_000)
        error = orjson.loads(body)["error"]
        assert status == 429 and headers.get("retry-after") == "1", body
        assert error["code"] == "request_bodies_in_flight" and "--max-body-bytes-in-flight" in error["message"]
        # The client that holds the bytes leaves: they are released at once.
        big[1].close()
        for _, writer in idle:
            writer.close()
        await asyncio.sleep(0.3)
        status, _, body = await exchange(
            gw.port, CHAT + f"Content-Length: {len(BODY)}\r\n\r\n".encode() + BODY)
        assert status == 200, body
        # A body that arrives whole is counted and released too: many in a row never add up.
        for _ in range(20):
            status, _, body = await exchange(
                gw.port, CHAT + f"Content-Length: {len(BODY) + 600_000}\r\n\r\n".encode() + BODY + b" " * 600_000)
            assert status == 200, body


async def test_a_chunked_body_is_counted_as_it_arrives(tmp_path: Path) -> None:
    with serve_process(tmp_path, "--max-body-bytes-in-flight", str(LIMIT)) as gw:
        first = await _hold(gw.port, 900_000, 2_000_000)
        await asyncio.sleep(0.5)
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        chunk = b" " * 300_000
        writer.write(CHAT + b"Transfer-Encoding: chunked\r\n\r\n" + f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        async with asyncio.timeout(10):
            head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 429"), head
        writer.close()
        first[1].close()
