"""``HTTPBackend`` against a real aiohttp server on loopback that answers as told: whole and
streamed replies, error statuses read whole, the API key sent, models and health by kind, and
aiohttp's failures translated (unreachable 502, broken answer 502, silence 504)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import orjson
import pytest
from aiohttp import web

from mmgate.app_runtime import start_app
from mmgate.backends import BackendKind, HTTPBackend, status_error
from mmgate.errors import BackendConnectError, BackendProtocolError, BackendStatusError, BackendTimeoutError
from tests.support.ports import free_port


@dataclass
class Script:
    """What the server does next, and what it saw."""

    chat_status: int = 200
    chat_delay_s: float = 0.0
    stream_frames: int = 3
    drop_mid_stream: bool = False
    models_body: bytes = b'{"object":"list","data":[{"id":"m1"},{"id":"m2"}]}'
    health_status: int = 200
    seen_auth: list[str | None] = field(default_factory=list)
    seen_paths: list[str] = field(default_factory=list)
    seen_peers: list[object] = field(default_factory=list)


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, Script]]:
    script = Script()

    async def chat(request: web.Request) -> web.StreamResponse:
        script.seen_auth.append(request.headers.get("Authorization"))
        script.seen_peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        body = orjson.loads(await request.read())
        await asyncio.sleep(script.chat_delay_s)
        if script.chat_status != 200:
            return web.json_response({"error": {"message": "told to fail", "code": script.chat_status}},
                                     status=script.chat_status)
        if not body.get("stream"):
            return web.json_response({"choices": [{"message": {"content": "ok"}}]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(script.stream_frames):
            await resp.write(f"data: {{\"i\": {i}}}\n\n".encode())
            if script.drop_mid_stream and i == 0:
                assert request.transport is not None
                request.transport.close()
                return resp
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.Response(body=script.models_body, content_type="application/json")

    async def health(request: web.Request) -> web.Response:
        script.seen_paths.append(request.path)
        return web.Response(status=script.health_status)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    runner, port = await start_app(app, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}", script
    finally:
        await runner.cleanup()


def make(url: str, kind: BackendKind = "vllm", **kw: object) -> HTTPBackend:
    options: dict[str, object] = {"connect_timeout_s": 1.0, "read_timeout_s": 2.0, **kw}
    return HTTPBackend("b", kind, url + "/", **options)  # type: ignore[arg-type]


async def test_whole_and_streamed_replies(server: tuple[str, Script]) -> None:
    url, script = server
    b = make(url, api_key="k-123")
    reply = await b.chat(b'{"model":"m1"}', stream=False)
    assert (reply.status, reply.stream) == (200, None) and orjson.loads(reply.body or b"")["choices"]
    reply = await b.chat(b'{"model":"m1","stream":true}', stream=True)
    assert reply.body is None and reply.stream is not None
    data = b"".join([chunk async for chunk in reply.stream])
    reply.release()
    assert data.count(b"data: ") == 4 and data.endswith(b"data: [DONE]\n\n")
    assert script.seen_auth == ["Bearer k-123", "Bearer k-123"]
    await b.close()


async def test_error_status_comes_back_whole_even_when_streaming(server: tuple[str, Script]) -> None:
    url, script = server
    script.chat_status = 400
    b = make(url)
    reply = await b.chat(b'{"stream":true}', stream=True)
    assert reply.status == 400 and reply.stream is None
    assert orjson.loads(reply.body or b"")["error"]["message"] == "told to fail"
    await b.close()


async def test_unreachable_is_connect_error() -> None:
    b = make(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(BackendConnectError) as info:
        await b.chat(b"{}", stream=False)
    assert info.value.status == 502 and info.value.code == "backend_unreachable"
    with pytest.raises(BackendConnectError):
        await b.models()
    assert await b.healthy() is False
    await b.close()


async def test_silence_is_timeout(server: tuple[str, Script]) -> None:
    url, script = server
    script.chat_delay_s = 1.0
    b = make(url, read_timeout_s=0.2)
    with pytest.raises(BackendTimeoutError) as info:
        await b.chat(b"{}", stream=False)
    assert info.value.status == 504
    await b.close()


async def test_stream_broken_off_is_protocol_error(server: tuple[str, Script]) -> None:
    url, script = server
    script.drop_mid_stream = True
    b = make(url)
    reply = await b.chat(b'{"stream":true}', stream=True)
    assert reply.stream is not None
    with pytest.raises(BackendProtocolError):
        async for _ in reply.stream:
            pass
    reply.release()
    await b.close()


async def test_models_and_health_by_kind(server: tuple[str, Script]) -> None:
    url, script = server
    vllm, openai = make(url, "vllm"), make(url, "openai")
    assert await vllm.models() == ["m1", "m2"]
    assert await vllm.healthy() is True and script.seen_paths == ["/health"]
    assert await openai.healthy() is True and script.seen_paths == ["/health"]  # openai: /v1/models
    script.health_status = 503
    assert await vllm.healthy() is False
    script.models_body = b"<html>"
    with pytest.raises(BackendProtocolError):
        await vllm.models()
    await vllm.close()
    await openai.close()


@pytest.mark.parametrize(
    ("backend_status", "client_status", "prefixed"),
    [(400, 400, False), (404, 404, False), (500, 502, True), (503, 503, True), (504, 504, True)],
)
def test_status_error_mapping(backend_status: int, client_status: int, prefixed: bool) -> None:
    err = status_error("b", backend_status, b'{"error": {"message": "nope"}}')
    assert isinstance(err, BackendStatusError)
    assert err.status == client_status and err.backend_status == backend_status
    assert err.message == (f"backend b answered HTTP {backend_status}: nope" if prefixed else "nope")


@pytest.mark.parametrize(("keepalive_s", "connections"), [(0.3, 2), (30.0, 1)])
async def test_idle_pooled_connection_dropped_after_keepalive(
        server: tuple[str, Script], keepalive_s: float, connections: int) -> None:
    """``--backend-keepalive`` (4 s, under vLLM's own 5 s): an idle pooled connection is closed by
    the gateway before the backend closes it, so no request is written on one the backend is
    closing. Two requests 0.8 s apart: a new connection (a new client port) past a 0.3 s
    keep-alive, the same one within 30 s (aiohttp's default, 15 s, would reuse it)."""
    url, script = server
    b = make(url, keepalive_s=keepalive_s)
    assert (await b.chat(b'{"model":"m1"}', stream=False)).status == 200
    await asyncio.sleep(0.8)
    assert (await b.chat(b'{"model":"m1"}', stream=False)).status == 200
    assert len(set(script.seen_peers)) == connections, script.seen_peers
    await b.close()
