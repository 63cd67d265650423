"""Clients that try to make the gateway work for nothing, against a real ``mmgate serve`` on
loopback (raw sockets): every one gets an answer, at a cost linear in what it sends.

* A request head dribbled a few bytes at a time on a kept-alive connection, after a 401 (the
  chat lane re-read and re-validated the whole partial head on every read: 4 such connections took
  18.5 s of CPU in 20 s); aiohttp's parser takes each read once. The gateway process's own CPU
  time is read from ``/proc`` (a CPU figure, not a wall-clock one: the machine's load moves it little).
* Chat sent with ``Connection: Upgrade`` and ``Upgrade: h2c`` (what ``curl --http2`` sends): answered
  as HTTP/1.1 (the chat lane answered nothing until ``--header-timeout``, with an ERROR traceback).
* A malformed request after a good one on the same connection: its 400.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import orjson

from tests.support.serve_process import GatewayProcess, serve_process

MODEL = "mmgate-sim-vl"
BODY = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
CHAT = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n" % len(BODY))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def read_reply(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One reply with a Content-Length body: its head and body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
    return head, await asyncio.wait_for(reader.readexactly(length), 10)


def status(head: bytes) -> int:
    return int(head.split(b" ")[1])


async def _dribbler(gw: GatewayProcess, head: bytes, piece: int, every_s: float) -> int:
    """A 401 on a kept-alive connection, then ``head`` sent ``piece`` bytes every ``every_s`` until
    the gateway answers; returns the status it answered with (0: it closed the connection)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    try:
        writer.write(CHAT + b"\r\n" + BODY)
        reply_head, _ = await read_reply(reader)
        assert status(reply_head) == 401
        answer = asyncio.ensure_future(reader.readline())
        for start in range(0, len(head), piece):
            if answer.done():
                break
            writer.write(head[start:start + piece])
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            await asyncio.sleep(every_s)
        line = await asyncio.wait_for(answer, 30)
        return int(line.split(b" ")[1]) if line else 0
    finally:
        writer.close()


async def test_a_dribbled_request_head_costs_the_gateway_little_cpu(tmp_path: Path) -> None:
    """4 connections, each a head of 2,000 tiny header lines sent one line (4 bytes) every 4 ms.
    The chat lane checked every line of the partial head again on each read (3.3 s of the
    gateway's CPU, growing with the square of the head); aiohttp's parser reads each byte once
    (0.02 s) and refuses the head past its 128th header line."""
    keys = tmp_path / "keys.txt"
    keys.write_text("key-a tenant-a\n")
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + b"a:\r\n" * 2000 + b"\r\n"
    with serve_process(tmp_path, "--api-keys-file", str(keys), "--header-timeout", "30") as gw:
        cpu_before = cpu_seconds(gw.proc.pid)
        statuses = await asyncio.gather(*(_dribbler(gw, head, 4, 0.004) for _ in range(4)))
        cpu = cpu_seconds(gw.proc.pid) - cpu_before
        assert all(400 <= s < 500 for s in statuses), statuses  # each dribbled head got its answer
        assert cpu < 1.0, cpu
        await asyncio.sleep(0.5)
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)  # and serves on
        writer.write(CHAT + b"Authorization: Bearer key-a\r\n\r\n" + BODY)
        assert status((await read_reply(reader))[0]) == 200
        writer.close()


async def test_chat_with_an_h2c_upgrade_is_answered_as_http_1_1(tmp_path: Path) -> None:
    with serve_process(tmp_path) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        try:
            for _ in range(2):  # and the connection serves the next request
                writer.write(CHAT + b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
                             b"HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n" + BODY)
                head, body = await read_reply(reader)
                assert head.startswith(b"HTTP/1.1 200 "), head
                assert orjson.loads(body)["choices"][0]["message"]["role"] == "assistant"
        finally:
            writer.close()
        assert "Traceback" not in gw.log(None)


async def test_a_malformed_request_after_a_good_one_gets_its_400(tmp_path: Path) -> None:
    with serve_process(tmp_path) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        try:
            writer.write(CHAT + b"\r\n" + BODY)
            head, _ = await read_reply(reader)
            assert status(head) == 200
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n")
            line = await asyncio.wait_for(reader.readline(), 10)
            assert status(line) == 400, line
        finally:
            writer.close()
        assert "Traceback" not in gw.log(None)
