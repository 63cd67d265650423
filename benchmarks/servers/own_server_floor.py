"""mmgate's chat pipeline served without aiohttp: what a server of mmgate's own would cost.

A gateway is started as ``mmgate serve`` starts it (``mmgate.serve.start_gateway``, one ``openai``
backend), and beside aiohttp's server an asyncio protocol on httptools' parser serves
POST /v1/chat/completions on its own port: each request goes through ``Gateway.chat`` (parse,
tenant-free policy, load, plan, route, send) and its reply is written back whole or relayed as an
event stream. Left out, so this is a floor and not a product: the observer (request id, access
log, tenant metrics), the guard (API keys, tenant slots, error shapes: any error is a bare 4xx/5xx),
the route's tracking and shutdown drain, the stream stall cut, the edge limits and timeouts.
``router_compare.py`` runs it beside mmgate as ``<tree>-own-server`` (text rows).

    python benchmarks/servers/own_server_floor.py PORT BACKEND_URL
"""

from __future__ import annotations

import argparse
import asyncio
import socket
from typing import Any

import httptools
import uvloop
from multidict import CIMultiDict

from mmgate.api import Gateway
from mmgate.config import BackendSpec, GatewaySettings, MediaSettings
from mmgate.errors import MmgateError
from mmgate.serve import start_gateway

CHAT = b"/v1/chat/completions"


class _Lane(asyncio.Protocol):
    """One client connection: requests parsed by httptools, chat requests run by the gateway."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._body: list[bytes] = []
        self._headers: CIMultiDict[str] = CIMultiDict()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self._url = url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.add(name.decode("latin-1"), value.decode("latin-1"))

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        raw, self._body = b"".join(self._body), []
        headers, self._headers = self._headers, CIMultiDict()
        assert self._transport is not None
        if self._url != CHAT:
            self._transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            return
        asyncio.get_running_loop().create_task(self._serve(self._transport, raw, headers))

    async def _serve(self, transport: asyncio.Transport, raw: bytes, headers: CIMultiDict[str]) -> None:
        try:
            outcome = await self._gateway.chat(raw, headers, tenant=None)
        except MmgateError as exc:
            transport.write(f"HTTP/1.1 {exc.status} Error\r\nContent-Length: 0\r\n\r\n".encode())
            return
        reply = outcome.reply
        try:
            extra = "".join(f"{name}: {value}\r\n" for name, value in outcome.headers.items())
            if reply.stream is None:
                body = reply.body or b""
                transport.write(f"HTTP/1.1 {reply.status} OK\r\nContent-Type: {reply.content_type}\r\n{extra}"
                                f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
                return
            out = (f"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n{extra}"
                   "Transfer-Encoding: chunked\r\n\r\n").encode()
            async for chunk in reply.stream:
                out += b"%x\r\n%b\r\n" % (len(chunk), chunk)
                if reply.stream_ended():
                    break
                transport.write(out)
                out = b""
            transport.write(out + b"0\r\n\r\n")
        finally:
            outcome.close()


async def main(port: int, backend: str) -> None:
    settings = GatewaySettings(port=0, backends=(BackendSpec(kind="openai", url=backend, name="backend"),),
                               media=MediaSettings(allowed_private=("127.0.0.1",)))
    running = await start_gateway(settings)
    loop = asyncio.get_running_loop()
    server: Any = await loop.create_server(lambda: _Lane(running.gateway), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("port", type=int)
    p.add_argument("backend_url")
    args = p.parse_args()
    uvloop.run(main(args.port, args.backend_url))
