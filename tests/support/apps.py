"""Small HTTP servers the tests write for one case (a backend that streams oddly, a metrics page in
chunks): an aiohttp app on a free loopback port for the block, and the vLLM-like frame most of
them share (``/v1/models`` listing one model, ``/health``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from aiohttp import web

from mmgate.app_runtime import start_app

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """``app`` on a free loopback port for the block; yields its base URL."""
    runner, port = await start_app(app, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def vllm_like(model: str, posts: dict[str, Handler]) -> web.Application:
    """An app that lists ``model`` at ``/v1/models``, answers ``/health`` and serves ``posts``
    (path → handler) as a vLLM replica would."""
    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": model, "object": "model"}]})

    async def health(_: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    for path, handler in posts.items():
        app.router.add_post(path, handler)
    return app
