"""A backend's connection is used again by the next request once a streamed reply has been read to
its end, on every API that streams through the chat pipeline. The backend is a real aiohttp server
on loopback that streams a chat reply event by event, its end a moment after ``[DONE]`` (as vLLM's
comes in a write of its own), and records the client port of each request it serves."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web

from mmgate.config import BackendSpec
from tests.support.apps import serving, vllm_like
from tests.support.gateway import gateway_settings, running_gateway

MODEL = "m"
FRAMES = [
    b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
    b'"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n',
    b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
    b'"delta":{"content":"hi"},"finish_reason":null}]}\n\n',
    b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
    b'"delta":{},"finish_reason":"stop"}]}\n\n',
    b"data: [DONE]\n\n",
]
BODIES = {
    "/v1/chat/completions": {"model": MODEL, "stream": True, "max_tokens": 4,
                             "messages": [{"role": "user", "content": "hi"}]},
    "/v1/messages": {"model": MODEL, "stream": True, "max_tokens": 4,
                     "messages": [{"role": "user", "content": "hi"}]},
}


@asynccontextmanager
async def streaming_backend(ports: list[int], *, reset: bool = False) -> AsyncIterator[str]:
    """``reset``: the connection is reset after ``[DONE]`` instead of the reply ending."""
    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        peer = request.transport.get_extra_info("peername") if request.transport else None
        ports.append(peer[1] if peer else -1)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for frame in FRAMES:
            await response.write(frame)
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)  # the reply's end comes apart from its last event
        if reset and request.transport is not None:
            request.transport.abort()
            return response
        await response.write_eof()
        return response

    async with serving(vllm_like(MODEL, {"/v1/chat/completions": chat})) as url:
        yield url


@pytest.mark.parametrize("path", list(BODIES))
async def test_a_streamed_reply_read_to_its_end_keeps_its_connection(path: str) -> None:
    ports: list[int] = []
    async with streaming_backend(ports) as url, running_gateway(gateway_settings(
            backends=(BackendSpec(kind="vllm", url=url, name="b"),))) as gw, aiohttp.ClientSession() as client:
        for _ in range(4):
            async with client.post(gw.url + path, json=BODIES[path]) as resp:
                text = await resp.text()
            assert resp.status == 200, text
            assert ("message_stop" if path == "/v1/messages" else "[DONE]") in text
    assert len(ports) == 4
    assert len(set(ports)) == 1, f"a new backend connection per request: client ports {ports}"


async def test_a_reply_cut_after_its_done_still_ends_the_message_cleanly() -> None:
    """The client had its whole answer at [DONE]: a reset while the rest is read costs the backend
    connection, and adds no error event after message_stop."""
    ports: list[int] = []
    async with streaming_backend(ports, reset=True) as url, running_gateway(gateway_settings(
            backends=(BackendSpec(kind="vllm", url=url, name="b"),))) as gw, aiohttp.ClientSession() as client:
        async with client.post(gw.url + "/v1/messages", json=BODIES["/v1/messages"]) as resp:
            text = await resp.text()
    assert resp.status == 200, text
    events = [line for line in text.splitlines() if line.startswith("event:")]
    assert events[-1] == "event: message_stop" and "event: error" not in events, events
