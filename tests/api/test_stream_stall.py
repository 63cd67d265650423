"""A streamed answer whose client stops reading, through a real ``mmgate serve``: the gateway cuts
it after ``--stream-stall-timeout`` (counted), which frees the backend connection and the
outstanding slot it held; other clients are served throughout."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import socket
import threading
import time
from pathlib import Path

import aiohttp
import orjson

from tests.support.serve_process import GatewayProcess, metric_value, serve_process
from tests.support.vllm import SimProcess


def unread_request(port: int, path: str, payload: dict[str, object], *, receive_buffer: int | None = None) -> socket.socket:
    """A client that sends ``payload`` to ``path`` and never reads the answer."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.connect(("127.0.0.1", port))
    body = orjson.dumps(payload)
    sock.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    return sock


def stalled_stream(port: int) -> socket.socket:
    """A client with a tiny receive buffer that sends a long streamed request and never reads."""
    return unread_request(port, "/v1/chat/completions", {
        "model": "tiny-qwen2vl", "stream": True, "max_tokens": 400_000, "ignore_eos": True,
        "messages": [{"role": "user", "content": "tell me everything"}]}, receive_buffer=4096)


async def stalled(gw: GatewayProcess, timeout_s: float = 8.0) -> None:
    """Wait for the gateway to count a stalled stream (its cut)."""
    deadline = time.monotonic() + timeout_s
    while metric_value(gw.metrics(), "mmgate_streams_stalled_total") < 1:
        assert time.monotonic() < deadline, "the stream went out whole into the socket's buffers"
        await asyncio.sleep(0.1)


async def load(url: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(url + "/load") as r:
        return float((await r.json())["server_load"])


async def test_a_stream_nobody_reads_is_cut_and_frees_its_backend(tmp_path: Path) -> None:
    # A fast engine with a long context, in a process of its own: each stream is far larger than
    # every buffer on the way.
    sim = SimProcess(tmp_path / "sim.log")
    sim.start(["--speedup", "100000", "--max-model-len", "1000000"])
    try:
        await _stalls(tmp_path, sim.url)
    finally:
        sim.stop()


async def _stalls(tmp_path: Path, engine: str) -> None:
    with serve_process(tmp_path, "--backend", f"vllm={engine}", "--stream-stall-timeout", "3") as gw:
        socks = [stalled_stream(gw.port) for _ in range(3)]
        try:
            deadline = time.monotonic() + 2
            while await load(gw.url) < 3 and time.monotonic() < deadline:  # all three in flight
                await asyncio.sleep(0.05)
            assert await load(gw.url) == 3
            async with aiohttp.ClientSession() as s:  # a victim is served meanwhile
                async with s.post(gw.url + "/v1/chat/completions", json={
                        "model": "tiny-qwen2vl", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}) as r:
                    assert r.status == 200
            deadline = time.monotonic() + 10
            while metric_value(gw.metrics(), "mmgate_streams_stalled_total") < 3:
                assert time.monotonic() < deadline, "the stalled streams were not cut"
                await asyncio.sleep(0.1)
            assert await load(gw.url) == 0  # their outstanding slots (and backend connections) are free
        finally:
            for sock in socks:
                sock.close()


async def test_streams_that_fill_the_backend_pool_do_not_fail_its_health_probes(tmp_path: Path) -> None:
    sim = SimProcess(tmp_path / "sim.log")
    sim.start(["--speedup", "100000", "--max-model-len", "1000000"])
    try:
        with serve_process(tmp_path, "--backend", f"vllm={sim.url}", "--backend-max-connections", "2",
                           "--backend-connect-timeout", "0.5", "--stream-stall-timeout", "60",
                           "--health-interval", "0.3", "--eject-after-failures", "1") as gw:
            socks = [stalled_stream(gw.port) for _ in range(2)]  # the request pool is full now
            try:
                deadline = time.monotonic() + 5
                while await load(gw.url) < 2:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.05)
                await asyncio.sleep(2.0)  # several probe rounds while the pool stays full
                async with aiohttp.ClientSession() as s, s.get(gw.url + "/health") as r:
                    assert r.status == 200, await r.text()
                assert metric_value(gw.metrics(), "mmgate_backend_healthy", backend="vllm-0") == 1
            finally:
                for sock in socks:
                    sock.close()
    finally:
        sim.stop()


async def test_a_full_backend_pool_is_a_503_not_a_failure(tmp_path: Path) -> None:
    """Waiting for a pool connection that never comes free is the backend being busy: 503 with
    Retry-After, and the backend is not ejected (one failure would eject it here)."""
    sim = SimProcess(tmp_path / "sim.log")
    sim.start(["--speedup", "100000", "--max-model-len", "1000000"])
    try:
        with serve_process(tmp_path, "--backend", f"vllm={sim.url}", "--backend-max-connections", "1",
                           "--backend-connect-timeout", "0.5", "--stream-stall-timeout", "60",
                           "--eject-after-failures", "1") as gw:
            sock = stalled_stream(gw.port)  # holds the one connection
            try:
                deadline = time.monotonic() + 5
                while await load(gw.url) < 1:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.05)
                async with aiohttp.ClientSession() as s:
                    async with s.post(gw.url + "/v1/chat/completions", json={
                            "model": "tiny-qwen2vl", "max_tokens": 2,
                            "messages": [{"role": "user", "content": "hi"}]}) as r:
                        body = await r.json()
                        assert r.status == 503 and body["error"]["code"] == "backend_busy", body
                        assert r.headers["Retry-After"] == "1"
                assert metric_value(gw.metrics(), "mmgate_backend_healthy", backend="vllm-0") == 1
            finally:
                sock.close()
            deadline = time.monotonic() + 10
            while True:  # the stream's end frees the connection: served again
                async with aiohttp.ClientSession() as s, s.post(gw.url + "/v1/chat/completions", json={
                        "model": "tiny-qwen2vl", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}) as r:
                    if r.status == 200:
                        break
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
    finally:
        sim.stop()


async def test_a_stream_nobody_reads_stalls_within_a_small_send_buffer(tmp_path: Path) -> None:
    # ~1.5 MB of SSE: what a client socket's send buffer could take whole if Linux grew it (up to
    # tcp_wmem's 4 MiB), so the stream would end without a stall; with the gateway's bounded
    # buffer it stalls and is cut.
    sim = SimProcess(tmp_path / "sim.log")
    sim.start(["--speedup", "100000", "--max-model-len", "1000000"])
    try:
        with serve_process(tmp_path, "--backend", f"vllm={sim.url}", "--stream-stall-timeout", "2") as gw:
            sock = unread_request(gw.port, "/v1/chat/completions", {
                "model": "tiny-qwen2vl", "stream": True, "max_tokens": 8_000, "ignore_eos": True,
                "messages": [{"role": "user", "content": "tell me everything"}]})
            try:
                await stalled(gw)
                assert await load(gw.url) == 0
            finally:
                sock.close()
    finally:
        sim.stop()


class _SpewingBackend(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible backend (``openai`` kind) whose ``/v1/completions`` streams ~2 MB of SSE,
    close-delimited, as fast as the gateway takes it (the sim serves chat only)."""

    protocol_version = "HTTP/1.0"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        body = orjson.dumps({"object": "list", "data": [{"id": "spew", "object": "model"}]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        frame = b"data: " + orjson.dumps({"id": "cmpl-1", "object": "text_completion", "model": "spew",
                                          "choices": [{"index": 0, "text": "x" * 60}]}) + b"\n\n"
        with contextlib.suppress(OSError):  # the gateway cut the stream
            for _ in range(16_000):
                self.wfile.write(frame)


async def test_a_forwarded_stream_nobody_reads_stalls_within_a_small_send_buffer(tmp_path: Path) -> None:
    # The endpoints forwarded as they are (here /v1/completions) bound the client's send buffer too.
    backend = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SpewingBackend)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{backend.server_address[1]}"
        with serve_process(tmp_path, "--backend", f"openai={url}", "--stream-stall-timeout", "2") as gw:
            sock = unread_request(gw.port, "/v1/completions", {"model": "spew", "stream": True,
                                                               "prompt": "tell me everything"})
            try:
                await stalled(gw)
            finally:
                sock.close()
    finally:
        backend.shutdown()
        backend.server_close()
