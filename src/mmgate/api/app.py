"""The gateway's HTTP surface (aiohttp): /v1/chat/completions, /v1/models, /health, /metrics.

``build_app(gateway)`` wraps a built ``Gateway``; ``mmgate.serve.start_gateway`` builds one from
settings and serves it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from mmgate.api import agents
from mmgate.api.edge import read_body
from mmgate.api.gateway import ChatOutcome, Gateway
from mmgate.api.responses import error_frame, error_response, http_error_response
from mmgate.errors import MmgateError, ShuttingDownError
from mmgate.metrics import GatewayMetrics
from mmgate.wire import json_response

log = logging.getLogger(__name__)
# Status counted for a client that went away before its answer was complete (nginx's convention).
CLIENT_CLOSED = 499
GATEWAY_KEY = web.AppKey("gateway", Gateway)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every ``MmgateError`` and aiohttp HTTP error becomes an OpenAI-style error body. Anything
    else is a bug of ours: aiohttp answers it with its plain 500 and logs the traceback."""
    try:
        return await handler(request)
    except MmgateError as exc:
        return error_response(exc)
    except web.HTTPException as exc:
        return http_error_response(exc)


def build_app(gateway: Gateway) -> web.Application:
    """The aiohttp application around ``gateway``."""
    # The body cap is enforced by ``read_body`` (Content-Length up front, chunked bodies as they come).
    app = web.Application(middlewares=[_errors], client_max_size=gateway.settings.max_body_bytes + 1)
    app[GATEWAY_KEY] = gateway
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    agents.register(app, gateway)
    return app


async def _chat(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY_KEY]
    metrics = gateway.metrics
    started = time.perf_counter()
    settings = gateway.settings
    status = 500
    task = asyncio.current_task()
    if task is not None:
        gateway.inflight.add(task)
    try:
        tenant = gateway.authenticate(request.headers)  # 401 before a byte of the body is read
        raw = await read_body(request, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s)
        outcome = await gateway.chat(raw, request.headers, tenant=tenant)
        status = 200
        try:
            response, complete = await _deliver(request, outcome, metrics, started, gateway)
            if not complete:
                status = CLIENT_CLOSED
            return response
        finally:
            # However delivery ended (done, client gone, cancelled): free the backend's connection
            # and its outstanding-request slot.
            outcome.reply.release()
            outcome.finish()
    except MmgateError as exc:
        status = exc.status
        raise
    except web.HTTPException as exc:
        status = exc.status
        raise
    except asyncio.CancelledError:
        # The client went away (aiohttp cancels its handler), or the drain time ran out at shutdown.
        status = ShuttingDownError.status if gateway.stopping else CLIENT_CLOSED
        raise
    except ConnectionError:
        status = CLIENT_CLOSED
        raise
    finally:
        gateway.inflight.discard(task)
        metrics.observe_chat(status, time.perf_counter() - started)


async def _deliver(
    request: web.Request, outcome: ChatOutcome, metrics: GatewayMetrics, started: float, gateway: Gateway
) -> tuple[web.StreamResponse, bool]:
    """Send a successful backend reply to the client: whole, or relayed frame by frame. Returns the
    response and whether it went out complete (False: the client went away mid-stream)."""
    reply = outcome.reply
    if reply.stream is None:
        body = web.Response(body=reply.body, status=200, content_type="application/json", headers=outcome.headers)
        return body, True
    response = web.StreamResponse(
        status=200,
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
            **outcome.headers,
        },
    )
    await response.prepare(request)
    first = True
    try:
        async for chunk in reply.stream:
            if first:
                metrics.ttft_seconds.observe(time.perf_counter() - started)
                first = False
            await response.write(chunk)
    except MmgateError as exc:
        # The stream has started: the status is sent, so the error travels as an SSE frame.
        log.warning("backend stream failed: %s", exc.message)
        with contextlib.suppress(ConnectionError):
            await response.write(error_frame(exc))
    except ConnectionError:
        # The client went away; the caller closes the backend stream, which tells it to stop.
        return response, False
    except asyncio.CancelledError:
        if gateway.stopping:
            # Cut at shutdown after the drain time: say so in the stream, end it cleanly.
            cut = ShuttingDownError("the gateway shut down before this stream finished; retry the request")
            with contextlib.suppress(ConnectionError, RuntimeError):
                await response.write(error_frame(cut))
                await response.write_eof()
        raise
    try:
        await response.write_eof()
    except ConnectionError:
        return response, False
    return response, True


async def _models(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY_KEY]
    if not gateway.router.models:
        await gateway.router.refresh_models()
    data = [
        {"id": model, "object": "model", "created": 0, "owned_by": "mmgate"} for model in gateway.router.models
    ]
    return json_response({"object": "list", "data": data})


async def _health(request: web.Request) -> web.StreamResponse:
    """200 while at least one backend passes its health checks, else 503; lists each backend."""
    router = request.app[GATEWAY_KEY].router
    backends = [
        {"name": b.name, "kind": b.kind, "url": b.url, "healthy": router.is_healthy(b),
         "outstanding": router.outstanding(b)}
        for b in router.backends
    ]
    healthy = any(b["healthy"] for b in backends)
    return json_response({"status": "ok" if healthy else "degraded", "backends": backends},
                         status=200 if healthy else 503)


async def _metrics(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY_KEY]
    return web.Response(body=generate_latest(gateway.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})
