"""``/v1/messages`` under attack, through a real gateway: a backend stream cut short ends with an
Anthropic ``error`` event. Real gateway and a scripted chat backend (an aiohttp server on loopback)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
import pytest
from aiohttp import web

from mmgate.app_runtime import start_app
from mmgate.config import BackendSpec
from tests.support.agents import call
from tests.support.gateway import gateway_settings, running_gateway

MODEL = "m1"


@asynccontextmanager
async def cutting_backend(tail: bytes) -> AsyncIterator[str]:
    """A chat backend whose streams send two good chunks, then ``tail``, then end the response."""
    chunks = [{"id": "c", "model": MODEL, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
              {"id": "c", "model": MODEL, "choices": [{"index": 0, "delta": {"content": "hello"}}]}]

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def health(_: web.Request) -> web.Response:
        return web.Response()

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in chunks:
            await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        if tail:
            await response.write(tail)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_post("/v1/chat/completions", chat)
    runner, port = await start_app(app, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("tail", [b'data: {"id":"c","model":"m1","choi', b""], ids=["mid-event", "no-done"])
async def test_a_stream_the_backend_ends_early_ends_with_an_error_event(tail: bytes) -> None:
    async with cutting_backend(tail) as url, running_gateway(gateway_settings(
            backends=(BackendSpec(kind="vllm", url=url, name="cut"),))) as gw:
        reply = await call(gw.url, "/v1/messages", {"model": MODEL, "max_tokens": 5, "stream": True,
                                                    "messages": [{"role": "user", "content": "hi"}]})
        names = [name for name, _ in reply.events]
        assert reply.status == 200 and names[0] == "message_start" and "content_block_delta" in names
        assert names[-1] == "error", names  # not a stream that just stops: the SDK sees why
        error = reply.events[-1][1]
        assert error["type"] == "error" and "cut" in error["error"]["message"], error
        assert "message_stop" not in names
