"""An OTLP/HTTP trace sink for benchmarks: accepts ``POST /v1/traces`` and answers the empty
export response (status 200), counting the spans' bytes, decoding nothing; ``GET /health`` for the
start-up wait. ``gateway_overhead.py --trace`` exports a gateway's spans to it.

    python benchmarks/servers/otlp_sink.py PORT
"""

from __future__ import annotations

import sys

from aiohttp import web


def sink() -> web.Application:
    """The app: counts the bytes of every export it is sent."""
    received = 0

    async def traces(request: web.Request) -> web.Response:
        nonlocal received
        received += len(await request.read())
        return web.Response(body=b"", content_type="application/x-protobuf")

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"received_bytes": received})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", traces)
    app.router.add_get("/health", health)
    return app


if __name__ == "__main__":
    web.run_app(sink(), host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
