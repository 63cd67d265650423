"""A real HTTP backend on loopback that answers any method and path by describing what it got:
the stand-in for vLLM endpoints whose exact answers do not matter (the real-vLLM tests compare
those). It serves ``/v1/models`` (with vLLM's extra model-card fields) and ``/health`` like vLLM.

``?status=N`` answers N with an OpenAI-style error body; ``?sse=N`` answers an event stream of N
frames (then ``data: [DONE]``); ``?slow=S`` waits S seconds first.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import orjson
from aiohttp import web

from mmgate.app_runtime import start_app


@dataclass
class Seen:
    """One request the echo backend received."""

    method: str
    path_qs: str
    headers: dict[str, str]
    body: bytes


@dataclass
class EchoBackend:
    url: str
    name: str
    models: list[str]
    seen: list[Seen] = field(default_factory=list)


def _card(model: str, name: str) -> dict[str, object]:
    return {"id": model, "object": "model", "created": 1, "owned_by": "vllm", "root": f"/models/{model}",
            "parent": None, "max_model_len": 4096, "permission": [{"id": f"perm-{name}", "object": "model_permission"}]}


@asynccontextmanager
async def echo_backend(name: str = "echo", models: tuple[str, ...] = ("m1",)) -> AsyncIterator[EchoBackend]:
    """An echo backend on a free loopback port for the block."""
    state = EchoBackend(url="", name=name, models=list(models))

    async def listing(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [_card(m, name) for m in state.models]})

    async def health(request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def absent(request: web.Request) -> web.Response:
        return web.Response(status=404)

    async def any_request(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        state.seen.append(Seen(request.method, request.path_qs, dict(request.headers), body))
        query = request.query
        if "slow" in query:
            await asyncio.sleep(float(query["slow"]))
        if "status" in query:
            status = int(query["status"])
            return web.json_response({"error": {"message": f"told to answer {status}", "type": "BadRequestError",
                                                "param": "x", "code": status}}, status=status)
        if "sse" in query:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for i in range(int(query["sse"])):
                await resp.write(b"data: " + orjson.dumps({"i": i, "backend": name}) + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            return resp
        return web.json_response({"backend": name, "method": request.method, "path": request.path_qs,
                                  "bytes": len(body), "content_type": request.headers.get("Content-Type"),
                                  "authorization": request.headers.get("Authorization")})

    app = web.Application(client_max_size=1 << 30)
    app.router.add_get("/v1/models", listing)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", absent)  # the gateway's load poll: not recorded
    app.router.add_get("/load", absent)
    app.router.add_route("*", "/{tail:.*}", any_request)
    runner, port = await start_app(app, "127.0.0.1", 0)
    state.url = f"http://127.0.0.1:{port}"
    try:
        yield state
    finally:
        await runner.cleanup()
