"""When a streamed reply's head leaves the gateway, through a real ``mmgate serve``: with its first
chunk when both are at hand (one write), at once when the backend has sent only its head (a
client must not wait for the first token to see the response start), and the stream's bytes
unchanged either way — on chat, on Responses and on Messages (mapped onto the backend's chat
stream). The backend is a real aiohttp server on loopback, in a thread of its own."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tests.support.ports import free_port
from tests.support.serve_process import serve_process

FRAMES = [b'data: {"id":"c1","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n',
          b'data: {"id":"c1","model":"m","choices":[{"index":0,"delta":{"content":"a"}}]}\n\n',
          b"data: [DONE]\n\n"]
FIRST_CHUNK_DELAY_S = 1.5


async def _chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)  # the head goes out now (aiohttp sends it at prepare)
    if body.get("model") == "slow":
        await asyncio.sleep(FIRST_CHUNK_DELAY_S)
    for frame in FRAMES:
        await response.write(frame)
    if body.get("model") == "lingers":  # after its [DONE]: a pause, a frame no client may see, the end
        await asyncio.sleep(FIRST_CHUNK_DELAY_S)
        await response.write(b"data: after-done\n\n")
    await response.write_eof()
    return response


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": m, "object": "model"} for m in ("m", "slow", "lingers")]})


@pytest.fixture
def backend() -> Iterator[str]:
    port = free_port()
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/responses", _chat)  # the frames are the same to the gateway
    app.router.add_get("/v1/models", _models)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


# Per API: the path, a streamed request body, the body the client should get (None: the backend's frames).
APIS = {
    "chat": ("/v1/chat/completions", {"stream": True, "messages": [{"role": "user", "content": "hi"}]}),
    "responses": ("/v1/responses", {"stream": True, "input": "hi"}),
    "messages": ("/v1/messages", {"stream": True, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}),
}


async def _stream(url: str, *, slow: bool, api: str = "chat", model: str | None = None) -> tuple[float, float, bytes]:
    """Seconds to the response's head, seconds to its end, and its body."""
    path, body = APIS[api]
    async with aiohttp.ClientSession() as s:
        started = time.monotonic()
        async with s.post(url + path, json={**body, "model": model or ("slow" if slow else "m")}) as r:
            head_s = time.monotonic() - started
            assert r.status == 200 and r.content_type == "text/event-stream"
            body = await r.read()
        return head_s, time.monotonic() - started, body


def _whole(api: str, body: bytes) -> bool:
    """``body`` is the whole stream the client should get for the backend's ``FRAMES``."""
    if api != "messages":
        return body == b"".join(FRAMES)
    names = [line[7:] for line in body.split(b"\n") if line.startswith(b"event: ")]
    return names[0] == b"message_start" and names[-1] == b"message_stop" and b'"text":"a"' in body


@pytest.mark.parametrize("api", list(APIS))
async def test_a_head_without_a_chunk_reaches_the_client_before_the_first_token(
        tmp_path: Path, backend: str, api: str) -> None:
    with serve_process(tmp_path, "--backend", f"openai={backend}") as gw:
        head_s, end_s, body = await _stream(gw.url, slow=True, api=api)
    assert end_s >= FIRST_CHUNK_DELAY_S  # the backend did hold its first chunk back
    assert head_s < FIRST_CHUNK_DELAY_S / 2, f"the head waited {head_s:.2f}s for the first chunk"
    assert _whole(api, body), body


@pytest.mark.parametrize("api", list(APIS))
async def test_a_stream_at_hand_goes_out_whole_and_unchanged(tmp_path: Path, backend: str, api: str) -> None:
    with serve_process(tmp_path, "--backend", f"openai={backend}") as gw:
        for _ in range(3):  # a fresh connection and a reused one
            _, _, body = await _stream(gw.url, slow=False, api=api)
            assert _whole(api, body), body


@pytest.mark.parametrize("api", ["chat", "messages"])
async def test_a_stream_ends_for_the_client_at_its_done(tmp_path: Path, backend: str, api: str) -> None:
    """Nothing follows ``data: [DONE]`` in an OpenAI stream: the client's stream ends with it (in
    the same write), not when the backend gets round to closing its reply; what a backend still
    sends is read, not relayed, and the connection serves the next request."""
    with serve_process(tmp_path, "--backend", f"openai={backend}") as gw:
        for _ in range(2):
            _, end_s, body = await _stream(gw.url, slow=False, api=api, model="lingers")
            assert end_s < FIRST_CHUNK_DELAY_S / 2, f"the stream ended {end_s:.2f}s in, with the backend's reply"
            assert _whole(api, body) and b"after-done" not in body, body
        _, _, body = await _stream(gw.url, slow=False, api=api)
        assert _whole(api, body), body
