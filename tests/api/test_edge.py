"""The HTTP edge of a real ``mmgate serve`` process, driven over raw loopback sockets the way a
hostile or broken client would: unauthenticated big bodies, lying Content-Length, slow headers and
bodies, many slow connections, clients that leave, and a shutdown with streams in flight."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import aiohttp
import orjson

from tests.support.serve_process import metric_value, serve_process

CHAT = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
BODY = orjson.dumps({"model": "mmgate-sim-vl", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})


async def exchange(port: int, data: bytes, *, timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    """Write ``data`` and read one answer (head, then Content-Length bytes); (status, headers, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        with contextlib.suppress(ConnectionError):  # the server may answer before reading it all
            await writer.drain()
        async with asyncio.timeout(timeout):
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").strip().split("\r\n")
            headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:] if ": " in line)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
    finally:
        writer.close()
    return int(lines[0].split(" ")[1]), headers, body


async def chat_ok(url: str) -> float:
    """One normal request; its latency in seconds (it must succeed)."""
    started = time.perf_counter()
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/chat/completions", data=BODY,
                                                    headers={"Content-Type": "application/json"}) as r:
        assert r.status == 200, await r.text()
        await r.read()
    return time.perf_counter() - started


async def test_unauthenticated_and_oversized_bodies_are_answered_before_the_body(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("key-a tenant-a\n")
    with serve_process(tmp_path, "--api-keys-file", str(keys), "--max-body-bytes", "1000000") as gw:
        # 250 MB announced, not a byte sent: the answer comes at once (the body is never awaited).
        started = time.perf_counter()
        status, _, body = await exchange(gw.port, CHAT + b"Content-Length: 250000000\r\n\r\n", timeout=5)
        assert status == 401 and b"authentication_error" in body
        status, _, body = await exchange(
            gw.port, CHAT + b"Authorization: Bearer key-a\r\nContent-Length: 250000000\r\n\r\n", timeout=5)
        assert status == 413 and orjson.loads(body)["error"]["code"] == "request_too_large"
        assert time.perf_counter() - started < 4
        # Chunked: counted as it arrives; refused past the cap.
        chunk = b"f4240\r\n" + b" " * 1_000_000 + b"\r\n"
        status, _, _ = await exchange(
            gw.port, CHAT + b"Authorization: Bearer key-a\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 2, timeout=10)
        assert status == 413


async def test_slow_headers_and_slow_bodies_are_timed_out(tmp_path: Path) -> None:
    with serve_process(tmp_path, "--header-timeout", "1", "--body-timeout", "1") as gw:
        started = time.perf_counter()
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # headers never finish
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 8) == b""  # the gateway closed it
        assert time.perf_counter() - started < 5
        writer.close()
        status, _, body = await exchange(gw.port, CHAT + b"Content-Length: 1000\r\n\r\n{\"model\"", timeout=8)
        assert status == 408 and orjson.loads(body)["error"]["code"] == "request_timeout"


async def test_slow_connections_are_closed_at_the_header_deadline_and_a_normal_client_is_served(
        tmp_path: Path) -> None:
    with serve_process(tmp_path, "--header-timeout", "2") as gw:
        slow = []
        for _ in range(200):  # each stuck in its headers
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            slow.append((reader, writer))
        await asyncio.gather(*(w.drain() for _, w in slow))
        assert await chat_ok(gw.url) < 5
        started = time.perf_counter()
        ends = await asyncio.wait_for(asyncio.gather(*(r.read() for r, _ in slow)), 10)
        assert ends == [b""] * len(slow)  # every one closed by the gateway, none answered
        assert time.perf_counter() - started < 4
        for _, w in slow:
            w.close()


async def test_a_client_that_leaves_is_counted_as_499(tmp_path: Path) -> None:
    with serve_process(tmp_path, "--sim-speedup", "1") as gw:
        long = orjson.dumps({"model": "mmgate-sim-vl", "max_tokens": 400, "ignore_eos": True, "stream": True,
                             "messages": [{"role": "user", "content": "hi"}]})
        for _ in range(2):
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            writer.write(CHAT + b"Content-Length: " + str(len(long)).encode() + b"\r\n\r\n" + long)
            await writer.drain()
            await asyncio.wait_for(reader.readuntil(b"data: "), 10)  # the stream has started
            writer.transport.abort()
        await asyncio.sleep(1.0)
        text = gw.metrics()
        assert metric_value(text, "mmgate_requests_total", route="/v1/chat/completions", status="499") == 2
        assert metric_value(text, "mmgate_requests_total", route="/v1/chat/completions", status="500") == 0


async def test_shutdown_drains_then_ends_cut_streams_with_an_sse_error_frame(tmp_path: Path) -> None:
    with serve_process(tmp_path, "--sim-speedup", "1", "--drain-timeout", "2") as gw:
        long = {"model": "mmgate-sim-vl", "max_tokens": 2000, "ignore_eos": True, "stream": True,
                "messages": [{"role": "user", "content": "hi"}]}  # 20 s of decode
        short = {"model": "mmgate-sim-vl", "max_tokens": 30, "ignore_eos": True, "stream": True,
                 "messages": [{"role": "user", "content": "hi"}]}

        async def stream(body: dict[str, object], started: asyncio.Event) -> bytes:
            async with aiohttp.ClientSession() as s, s.post(gw.url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200
                out = b""
                async for chunk in r.content.iter_any():
                    out += chunk
                    started.set()
                return out

        began = [asyncio.Event(), asyncio.Event()]
        tasks = [asyncio.create_task(stream(long, began[0])), asyncio.create_task(stream(short, began[1]))]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in began)), 15)
        stopped_at = time.perf_counter()
        await asyncio.to_thread(gw.proc.send_signal, 15)
        cut, finished = await asyncio.wait_for(asyncio.gather(*tasks), 20)
        assert b"[DONE]" in finished  # finished inside the drain time
        assert b'"shutting_down"' in cut and b"[DONE]" not in cut
        assert cut.rstrip().endswith(b"}")  # a whole SSE frame, then a clean end of the stream
        assert await asyncio.to_thread(gw.proc.wait, 20) == 0
        assert 1.5 < time.perf_counter() - stopped_at < 15
