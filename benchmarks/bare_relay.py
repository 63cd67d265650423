"""The floor for an aiohttp-served gateway: a relay that parses nothing, routes nothing, counts nothing.

POST /v1/chat/completions is forwarded to one backend and its reply relayed chunk by chunk (SSE) —
the I/O every such gateway must do, with the writes coalesced as mmgate's relay coalesces them
(the head with a first chunk at hand, the last chunk with the end). The backend client is
aiohttp's (``--client aiohttp``, the default) or mmgate's own lean one (``--client wire``,
``mmgate.backends.wire``, what mmgate's request path uses): the first is the floor of a plain
aiohttp relay, the second the floor of mmgate's HTTP stack. ``gateway_overhead.py`` and
``router_compare.py`` run it beside mmgate so the CPU mmgate adds on top of its HTTP stack can be
read off. ``--client lean-server`` has no aiohttp at all: an asyncio protocol on httptools' parser
serving the client and the lean client behind it, the floor of a server of one's own (what
replacing aiohttp's server would start from).

    python benchmarks/bare_relay.py PORT BACKEND_PORT [--client aiohttp|wire|lean-server]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import uvloop
from aiohttp import web

Relay = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _HeadWithFirstChunk(web.StreamResponse):
    _send_headers_immediately = False


def aiohttp_relay(backend_port: int) -> Relay:
    session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())
    url = f"http://127.0.0.1:{backend_port}/v1/chat/completions"

    async def chat(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        async with session.post(url, data=raw, headers={"Content-Type": "application/json"}) as upstream:
            if not upstream.content_type.startswith("text/event-stream"):
                return web.Response(body=await upstream.read(), status=upstream.status,
                                    content_type=upstream.content_type)
            response = _HeadWithFirstChunk(status=upstream.status, headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            content = upstream.content
            if not (content.total_bytes or content.is_eof()):
                await response.write(b"")
            async for chunk in content.iter_any():
                await (response.write_eof(chunk) if content.at_eof() else response.write(chunk))
            await response.write_eof()
            return response

    return chat


def wire_pool(backend_port: int) -> tuple[Any, str]:
    """This tree's lean backend client to the backend, and the head of each request (less its length)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))  # this tree's mmgate
    from mmgate.backends.wire import WirePool

    pool = WirePool("127.0.0.1", backend_port, limit=1024, connect_timeout_s=5.0, read_timeout_s=300.0,
                    keepalive_s=4.0)
    return pool, f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{backend_port}\r\nContent-Type: application/json\r\n"


def wire_relay(backend_port: int) -> Relay:
    pool, head = wire_pool(backend_port)

    async def chat(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        ex = await pool.send(f"{head}Content-Length: {len(raw)}\r\n\r\n".encode(), raw)
        try:
            content_type = ex.content_type or "application/json"
            if not content_type.startswith("text/event-stream"):
                return web.Response(body=await ex.read_all(), status=ex.status, content_type=content_type)
            ex.streaming = True
            response = _HeadWithFirstChunk(status=ex.status, headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            if not ex.arrived():
                await response.write(b"")
            while True:
                chunk = ex.take()
                if chunk is not None:
                    await (response.write_eof(chunk) if ex.ended() else response.write(chunk))
                elif ex.complete:
                    break
                else:
                    await ex.wait()
            await response.write_eof()
            return response
        finally:
            ex.finish()

    return chat


class _LeanServer(asyncio.Protocol):
    """HTTP/1.1 keep-alive on httptools' parser, no framework: the floor of a server of one's own.
    POST /v1/chat/completions goes to the lean client; anything else is answered ``ok``."""

    def __init__(self, pool: Any, head: str) -> None:
        import httptools

        self._parser = httptools.HttpRequestParser(self)
        self._pool, self._head = pool, head
        self._url = b""
        self._body: list[bytes] = []
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as aiohttp's server does

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self._url = url

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        body, self._body = b"".join(self._body), []
        if self._url != b"/v1/chat/completions":
            assert self._transport is not None
            self._transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            return
        asyncio.get_running_loop().create_task(self._relay(body))

    async def _relay(self, raw: bytes) -> None:
        transport = self._transport
        assert transport is not None
        ex = await self._pool.send(f"{self._head}Content-Length: {len(raw)}\r\n\r\n".encode(), raw)
        try:
            content_type = ex.content_type or "application/json"
            if not content_type.startswith("text/event-stream"):
                body = await ex.read_all()
                transport.write(f"HTTP/1.1 {ex.status} OK\r\nContent-Type: {content_type}\r\n"
                                f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
                return
            ex.streaming = True
            head = f"HTTP/1.1 {ex.status} OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            out = head.encode()
            while True:
                chunk = ex.take()
                if chunk is not None:
                    out += b"%x\r\n%b\r\n" % (len(chunk), chunk)
                if ex.ended():
                    transport.write(out + b"0\r\n\r\n")
                    return
                if out:
                    transport.write(out)
                    out = b""
                await ex.wait()
        finally:
            ex.finish()


async def lean_main(pool: Any, head: str, port: int) -> None:
    server = await asyncio.get_running_loop().create_server(lambda: _LeanServer(pool, head), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


async def main(port: int, backend_port: int, client: str) -> None:
    if client == "lean-server":
        return await lean_main(*wire_pool(backend_port), port)
    chat = (wire_relay if client == "wire" else aiohttp_relay)(backend_port)

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(client_max_size=256 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("port", type=int)
    p.add_argument("backend_port", type=int)
    p.add_argument("--client", choices=("aiohttp", "wire", "lean-server"), default="aiohttp",
                   help="lean-server: no aiohttp at all, httptools on both sides")
    args = p.parse_args()
    uvloop.run(main(args.port, args.backend_port, args.client))
