"""The floor for an aiohttp-served gateway: a relay that parses nothing, routes nothing, counts nothing.

POST /v1/chat/completions (and /v1/responses) is forwarded to one backend and its reply relayed chunk by chunk (SSE) —
the I/O every such gateway must do, with the writes coalesced as mmgate's relay coalesces them
(the head with a first chunk at hand, the last chunk with the end), on aiohttp's server and client:
the floor of mmgate's HTTP stack. ``gateway_overhead.py`` and ``router_compare.py`` run it beside
mmgate so the CPU mmgate adds on top of its HTTP stack can be read off.

A request with the header ``x-bench-keep: N`` has only its first N bytes forwarded: a client that
pads its body (JSON allows trailing whitespace) makes this an ideal stripping gateway, one that
costs aiohttp's relay and nothing more (``agent_capacity.py``'s ``floor`` mode).

    python benchmarks/servers/bare_relay.py PORT BACKEND_PORT
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable

import aiohttp
import uvloop
from aiohttp import web

Relay = Callable[[web.Request], Awaitable[web.StreamResponse]]
KEEP_HEADER = "x-bench-keep"  # forward only this many of the body's first bytes


class _HeadWithFirstChunk(web.StreamResponse):
    _send_headers_immediately = False


def aiohttp_relay(backend_port: int) -> Relay:
    session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())
    base = f"http://127.0.0.1:{backend_port}"

    async def chat(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        keep = request.headers.get(KEEP_HEADER)
        data = memoryview(raw)[:int(keep)] if keep is not None else raw
        async with session.post(base + request.path, data=data, headers={"Content-Type": "application/json"}) as upstream:
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


async def main(port: int, backend_port: int) -> None:
    chat = aiohttp_relay(backend_port)

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(client_max_size=256 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/responses", chat)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("port", type=int)
    p.add_argument("backend_port", type=int)
    args = p.parse_args()
    uvloop.run(main(args.port, args.backend_port))
