"""The built-in image origin: serves the dataset's image files over HTTP on loopback.

With ``--image-mode origin`` requests carry ``http://127.0.0.1:PORT/images/<key>.<ext>`` URLs, so
URL loading and URL caching on the server side (mmgate's media tiers, vLLM's fetcher) are part of
what is measured. Only files of the dataset are served (by content key), nothing else on disk.
The origin counts what it served: a gateway that caches URLs shows fewer origin hits than requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from mmgate.app_runtime import start_app
from mmgate.bench.images import sniff_image_type


@dataclass(slots=True)
class OriginStats:
    """What the origin served."""

    requests: int = 0
    bytes_served: int = 0
    not_found: int = 0


class ImageOrigin:
    """A loopback aiohttp server for the dataset's image files."""

    def __init__(self, lookup: Callable[[str], str | None], host: str = "127.0.0.1", port: int = 0) -> None:
        self._lookup = lookup
        self._host = host
        self._port = port
        self._runner: web.AppRunner | None = None
        self.stats = OriginStats()

    @property
    def url(self) -> str:
        """Base URL (``http://host:port``); valid once started."""
        return f"http://{self._host}:{self._port}"

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/images/{name}", self._serve)
        self._runner, self._port = await start_app(app, self._host, self._port)
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        path = self._lookup(name)
        if path is None:
            self.stats.not_found += 1
            raise web.HTTPNotFound(text="unknown image")
        self.stats.requests += 1
        etag = '"' + name.partition(".")[0] + '"'
        headers = {"Cache-Control": "public, max-age=3600", "ETag": etag}
        if request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers=headers)
        try:
            data = await asyncio.to_thread(Path(path).read_bytes)
        except OSError as exc:
            raise web.HTTPNotFound(text=f"unreadable image: {exc.strerror}") from exc
        self.stats.bytes_served += len(data)
        mime, _ = sniff_image_type(data)
        return web.Response(body=data, content_type=mime, headers=headers)
