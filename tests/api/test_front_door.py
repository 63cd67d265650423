"""The front door (``mmgate.frontdoor``) of a real ``mmgate serve`` process: the process that holds
client connections until their request head is complete. Driven over raw loopback sockets; its
process is really killed, and so is the gateway's."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from tests.api.test_edge import BODY, CHAT, chat_ok, exchange
from tests.support.serve_process import metric_value, serve_process


def front_doors(pid: int) -> list[int]:
    """The gateway's child processes that run the front door."""
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as f:
            for child in f.read().split():
                with contextlib.suppress(OSError), open(f"/proc/{child}/cmdline", "rb") as c:
                    if b"mmgate.frontdoor" in c.read():
                        out.append(int(child))
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


async def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def chat_bytes() -> bytes:
    return CHAT + b"Content-Length: " + str(len(BODY)).encode() + b"\r\n\r\n" + BODY


async def test_a_request_sent_with_its_head_in_one_write_is_answered_whole(tmp_path: Path) -> None:
    with serve_process(tmp_path) as gw:
        assert len(front_doors(gw.proc.pid)) == 1
        status, _, body = await exchange(gw.port, chat_bytes())  # head and body in one segment
        assert status == 200 and orjson.loads(body)["choices"][0]["message"]["content"]
        # Two requests in the first packet: the front door hands over both; both are answered.
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" * 2)
        await writer.drain()
        async with asyncio.timeout(10):
            for _ in range(2):
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200")
                length = next(int(line.split(b": ")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length: "))
                await reader.readexactly(length)
        writer.close()


async def test_a_head_past_the_limit_is_refused_with_a_400_not_held(tmp_path: Path) -> None:
    with serve_process(tmp_path, "--header-timeout", "30") as gw:
        started = time.perf_counter()
        status, _, _ = await exchange(gw.port, b"GET /health HTTP/1.1\r\nX-Long: " + b"a" * 70_000, timeout=10)
        assert status == 400 and time.perf_counter() - started < 5  # not left to the 30 s deadline
        assert await chat_ok(gw.url) < 5


async def test_a_first_line_that_is_no_request_line_gets_the_parsers_400_at_once(tmp_path: Path) -> None:
    with serve_process(tmp_path, "--header-timeout", "30") as gw:
        for garbage in (b"\x16\x03\x01\x02\x00\x01\x00\n", b"HELLO\r\n",
                        b"GET / HTTP/1.1\r\nHost: x\r\nno colon here\r\n"):
            started = time.perf_counter()
            status, _, _ = await exchange(gw.port, garbage, timeout=10)  # no blank line follows
            assert status == 400 and time.perf_counter() - started < 5, garbage


async def test_slow_heads_are_timed_out_by_the_front_door_and_counted(tmp_path: Path) -> None:
    with serve_process(tmp_path, "--header-timeout", "0.5") as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(b"GET /health HTTP/1.1\r\n")
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        await until(lambda: metric_value(gw.metrics(), "mmgate_edge_connections_total", event="timed_out") >= 1)


async def test_the_front_door_is_started_again_when_it_dies(tmp_path: Path) -> None:
    with serve_process(tmp_path) as gw:
        [door] = front_doors(gw.proc.pid)
        os.kill(door, signal.SIGKILL)
        await until(lambda: not alive(door))
        await until(lambda: len(front_doors(gw.proc.pid)) == 1 and front_doors(gw.proc.pid)[0] != door)
        assert await chat_ok(gw.url) < 5  # served again; clients meanwhile waited in the backlog
        assert "front door process ended" in gw.log(tail=None)


async def test_the_front_door_ends_with_the_gateway_even_when_it_is_killed(tmp_path: Path) -> None:
    with serve_process(tmp_path) as gw:
        [door] = front_doors(gw.proc.pid)
        assert await chat_ok(gw.url) < 5
        gw.proc.kill()
        gw.proc.wait(10)
        await until(lambda: not alive(door))


def test_without_the_front_door_there_is_no_child_process(tmp_path: Path) -> None:
    with serve_process(tmp_path, "--no-front-door") as gw:
        assert front_doors(gw.proc.pid) == []
        assert asyncio.run(chat_ok(gw.url)) < 5


async def test_while_the_gateway_stalls_a_waiting_client_gets_a_503_not_a_silent_close(tmp_path: Path) -> None:
    """The gateway really stops (SIGSTOP) for longer than the hand-over wait: the front door hands
    over what the control socket takes and answers every other complete head 503 + Retry-After."""
    with serve_process(tmp_path) as gw:
        assert await chat_ok(gw.url) < 5
        conns = []
        os.kill(gw.proc.pid, signal.SIGSTOP)
        try:
            for _ in range(600):  # more than the control socket buffers (its send buffer: ~200 messages)
                reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
                writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                await writer.drain()
                conns.append((reader, writer))
            await asyncio.sleep(3.0)  # past the front door's 2-s hand-over wait
        finally:
            os.kill(gw.proc.pid, signal.SIGCONT)
        statuses = []
        for reader, writer in conns:
            answer = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            assert answer.startswith(b"HTTP/1.1 "), answer  # never closed without an answer
            statuses.append(int(answer.split(b" ")[1]))
            if statuses[-1] == 503:
                assert b"Retry-After: 1" in answer and b"gateway_busy" in answer
        assert 503 in statuses and 200 in statuses, statuses  # the queued ones were served after the stall
        await until(lambda: metric_value(gw.metrics(), "mmgate_edge_connections_total", event="busy")
                    == statuses.count(503))
        assert await chat_ok(gw.url) < 5
