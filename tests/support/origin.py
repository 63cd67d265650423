"""A real image origin (aiohttp) on 127.0.0.1 for media tests.

Routes (every request is counted per path in ``hits``):

* ``/img/{name}``               a registered image (``add``)
* ``/gated/{name}``             the image, once ``gate`` is set (concurrency tests)
* ``/status/{code}``            that status with a short body
* ``/redirect?to=URL&code=302`` a redirect to ``to``; ``/chain/{n}/{name}`` redirects n times, then
                                serves ``/img/{name}``; ``/no-location`` a 302 without Location
* ``/slow-headers/{name}``      waits ``delay`` seconds (or until stop) before answering
* ``/slow-body/{name}``         sends headers and one chunk, then stalls
* ``/big?size=N&declare=1``     streams N bytes (Content-Length only when ``declare``); records in
                                ``big_sent`` how many bytes it wrote before the client went away
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable

from aiohttp import web

from mmgate.app_runtime import start_app

_CHUNK = 64 * 1024


class ImageOrigin:
    """The origin; ``await start()``, then ``url(path)``; ``await stop()`` at the end."""

    def __init__(self) -> None:
        self.images: dict[str, tuple[bytes, str]] = {}
        self.hits: collections.Counter[str] = collections.Counter()
        self.gate = asyncio.Event()
        self.big_sent: int | None = None
        self.big_done = asyncio.Event()
        self._stopping = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0

    def add(self, name: str, data: bytes, content_type: str = "image/png") -> str:
        self.images[name] = (data, content_type)
        return self.url(f"/img/{name}")

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    async def start(self) -> ImageOrigin:
        app = web.Application()
        app.middlewares.append(self._count)
        app.router.add_get("/img/{name}", self._img)
        app.router.add_get("/gated/{name}", self._gated)
        app.router.add_get("/status/{code}", self._status)
        app.router.add_get("/redirect", self._redirect)
        app.router.add_get("/chain/{n}/{name}", self._chain)
        app.router.add_get("/no-location", self._no_location)
        app.router.add_get("/slow-headers/{name}", self._slow_headers)
        app.router.add_get("/slow-body/{name}", self._slow_body)
        app.router.add_get("/big", self._big)
        self._runner, self.port = await start_app(app, "127.0.0.1", 0)
        return self

    async def stop(self) -> None:
        self._stopping.set()
        self.gate.set()
        if self._runner is not None:
            await self._runner.cleanup()

    @web.middleware
    async def _count(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        self.hits[request.path] += 1
        return await handler(request)

    def _image(self, name: str) -> web.Response:
        if name not in self.images:
            raise web.HTTPNotFound(text="no such image")
        data, ctype = self.images[name]
        return web.Response(body=data, content_type=ctype)

    async def _img(self, request: web.Request) -> web.Response:
        return self._image(request.match_info["name"])

    async def _gated(self, request: web.Request) -> web.Response:
        await self.gate.wait()
        return self._image(request.match_info["name"])

    async def _status(self, request: web.Request) -> web.Response:
        return web.Response(status=int(request.match_info["code"]), text="origin says no")

    async def _redirect(self, request: web.Request) -> web.Response:
        code = int(request.query.get("code", "302"))
        return web.Response(status=code, headers={"Location": request.query["to"]})

    async def _chain(self, request: web.Request) -> web.Response:
        n = int(request.match_info["n"])
        name = request.match_info["name"]
        location = f"/chain/{n - 1}/{name}" if n > 1 else f"/img/{name}"
        return web.Response(status=302, headers={"Location": location})

    async def _no_location(self, request: web.Request) -> web.Response:
        return web.Response(status=302)

    async def _slow_headers(self, request: web.Request) -> web.Response:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), float(request.query.get("delay", "30")))
        return self._image(request.match_info["name"])

    async def _slow_body(self, request: web.Request) -> web.StreamResponse:
        data, ctype = self.images[request.match_info["name"]]
        resp = web.StreamResponse(headers={"Content-Type": ctype, "Content-Length": str(len(data))})
        await resp.prepare(request)
        await resp.write(data[:100])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), 30)
        return resp

    async def _big(self, request: web.Request) -> web.StreamResponse:
        size = int(request.query["size"])
        headers = {"Content-Type": "image/png"}
        if request.query.get("declare") == "1":
            headers["Content-Length"] = str(size)
        resp = web.StreamResponse(headers=headers)
        sent = 0
        chunk = b"\x89PNG" + b"\x00" * (_CHUNK - 4)
        try:
            await resp.prepare(request)
            while sent < size and not self._stopping.is_set():
                await resp.write(chunk[: min(_CHUNK, size - sent)])
                sent += min(_CHUNK, size - sent)
            await resp.write_eof()
        except (ConnectionError, OSError):
            pass  # the client closed the connection: that is what the test measures
        finally:
            self.big_sent = sent
            self.big_done.set()
        return resp
