"""``bare_relay.py`` as a plain ASGI app, for the ASGI servers ``http_stacks.py`` measures.

POST /v1/chat/completions is read whole, sent to the backend on aiohttp's client, and its reply
relayed: an SSE stream chunk by chunk (the last chunk with the end), any other body at once.
GET /health answers ``ok``. The backend's base URL comes from ``$HTTP_STACKS_BACKEND``.

    HTTP_STACKS_BACKEND=http://127.0.0.1:8799 granian --interface asgi asgi_relay:app
    python benchmarks/servers/asgi_relay.py --uvicorn PORT
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

BACKEND_ENV = "HTTP_STACKS_BACKEND"
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class Relay:
    """The ASGI callable; its client session is made on the first request, in the server's loop."""

    def __init__(self) -> None:
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        if self.session is None:
            self.session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())
        url = os.environ[BACKEND_ENV] + "/v1/chat/completions"
        async with self.session.post(url, data=b"".join(chunks),
                                     headers={"Content-Type": "application/json"}) as upstream:
            content_type = upstream.headers.get("Content-Type", "application/octet-stream").encode()
            if not upstream.content_type.startswith("text/event-stream"):
                body = await upstream.read()
                await send({"type": "http.response.start", "status": upstream.status,
                            "headers": [(b"content-type", content_type),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
            await send({"type": "http.response.start", "status": upstream.status,
                        "headers": [(b"content-type", content_type)]})
            content = upstream.content
            ended = False
            async for chunk in content.iter_any():
                ended = content.at_eof()
                await send({"type": "http.response.body", "body": chunk, "more_body": not ended})
            if not ended:
                await send({"type": "http.response.body", "body": b""})


app = Relay()


if __name__ == "__main__":
    import uvicorn

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--uvicorn", type=int, required=True, metavar="PORT")
    port = p.parse_args().uvicorn
    uvicorn.run("asgi_relay:app", host="127.0.0.1", port=port, http="httptools", loop="uvloop", lifespan="off",
                access_log=False, log_level="warning", app_dir=str(Path(__file__).resolve().parent))
