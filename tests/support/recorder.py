"""A recording reverse proxy on loopback: forwards every request to a real upstream (a sim engine)
and keeps the bodies it saw, so tests can assert what the gateway actually sent to a backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from mmgate.app_runtime import start_app


@dataclass
class Recorder:
    """What the proxy saw: chat request bodies, parsed."""

    url: str = ""
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)  # of each chat request

    def image_parts(self, index: int = -1) -> list[dict[str, Any]]:
        body = self.bodies[index]
        return [
            p for m in body["messages"] if isinstance(m.get("content"), list)
            for p in m["content"] if p.get("type") == "image_url"
        ]


@asynccontextmanager
async def recording_proxy(upstream: str) -> AsyncIterator[Recorder]:
    """Start the proxy in front of ``upstream``; yields the Recorder (``.url`` is the proxy)."""
    recorder = Recorder()
    # A connection per request: reusing one that vLLM (uvicorn, keep-alive 5 s) is closing gets a
    # reset, which made the corpus table show a 502 (twice, once with a 2 s keep-alive here too).
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))

    async def forward(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        if request.method == "POST" and request.path.endswith("/chat/completions"):
            recorder.bodies.append(orjson.loads(raw))
            recorder.headers.append(dict(request.headers))
        async with session.request(
            request.method, upstream + request.path_qs, data=raw or None,
            headers={"Content-Type": request.headers.get("Content-Type", "application/json")},
        ) as upstream_resp:
            response = web.StreamResponse(status=upstream_resp.status)
            response.content_type = upstream_resp.content_type
            await response.prepare(request)
            async for chunk in upstream_resp.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app = web.Application(client_max_size=256 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", forward)
    runner, port = await start_app(app, "127.0.0.1", 0)
    recorder.url = f"http://127.0.0.1:{port}"
    try:
        yield recorder
    finally:
        await runner.cleanup()
        await session.close()
