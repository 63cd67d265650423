"""HTTP front of the sim, a stand-in for vLLM's OpenAI-compatible server (not a model).

Routes: ``POST /v1/chat/completions`` (SSE streaming and not), ``/v1/responses`` and its stored
responses (the same engine behind the Responses API, ``mmgate.sim.responses_http``), ``/v1/messages``
(Anthropic's, over the chat path as vLLM serves it: ``mmgate.sim.messages_api``), ``GET /v1/models``, ``GET /health``,
``GET /metrics``, ``GET /load`` (vLLM's server load: chat and Responses requests in flight, with
``--enable-server-load-tracking``). No module state: every app owns its engine, cache and Prometheus registry, so
``mmgate serve`` can run several engines in one process.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError
from prometheus_client import CONTENT_TYPE_LATEST

from mmgate.app_runtime import json_response, start_app
from mmgate.sim import messages_api, responses_http, wire
from mmgate.sim.config import SimSettings
from mmgate.sim.engine import Admitted, SimEngine, sleep_until
from mmgate.sim.errors import SimError
from mmgate.sim.metrics import SimStats

ENGINE_KEY = web.AppKey("mmgate_sim_engine", SimEngine)


def build_app(settings: SimSettings) -> web.Application:
    """An aiohttp app serving one sim engine; the engine closes with the app."""
    engine = SimEngine(settings)
    app = web.Application(client_max_size=settings.max_body_bytes)
    app[ENGINE_KEY] = engine
    app.router.add_post("/v1/chat/completions", _served(_admitted_chat))
    app.router.add_post("/v1/responses", _served(responses_http.create))
    app.router.add_post("/v1/messages", _served(_messages))
    app.router.add_post("/v1/messages/count_tokens", _served(_count_tokens))
    app.router.add_get("/v1/responses/{response_id}", _with_engine(responses_http.retrieve))
    app.router.add_post("/v1/responses/{response_id}/cancel", _with_engine(responses_http.cancel))
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/load", _load)

    async def _close(_: web.Application) -> None:
        await engine.close()

    app.on_cleanup.append(_close)
    return app


@dataclass
class SimServer:
    """A running sim engine on a loopback (or configured) port."""

    app: web.Application
    runner: web.AppRunner
    port: int
    host: str

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("", "0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"

    @property
    def engine(self) -> SimEngine:
        return self.app[ENGINE_KEY]

    @property
    def stats(self) -> SimStats:
        return self.engine.metrics.stats

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start_sim(settings: SimSettings) -> SimServer:
    """Start an engine (port 0: any free port) and return it running."""
    app = build_app(settings)
    runner, port = await start_app(app, settings.host, settings.port)
    return SimServer(app=app, runner=runner, port=port, host=settings.host)


def _with_engine(
    handler: Callable[[web.Request, SimEngine], Awaitable[web.StreamResponse]],
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def with_engine(request: web.Request) -> web.StreamResponse:
        return await handler(request, request.app[ENGINE_KEY])

    return with_engine


def _error(engine: SimEngine, exc: SimError) -> web.Response:
    status, body = wire.error_from_exception(exc)
    engine.metrics.request(status)
    return json_response(body, status=status)


Answer = Callable[[web.Request, SimEngine, bytes, float], Awaitable[web.StreamResponse]]


def _served(answer: Answer) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A handler that reads the body and has ``answer`` answer it, counted in the server load
    while it runs (with ``--enable-server-load-tracking``: vLLM's ``load_aware_call``, on chat
    completions and the Responses API alike)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        engine = request.app[ENGINE_KEY]
        # The modelled times run from the request's arrival: the sim's own real work (reading, decoding,
        # processing) is part of them, as vLLM's is of its measured times (see benchmarks/regression/sim_fidelity.py).
        arrived = asyncio.get_running_loop().time()
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            engine.metrics.request(413)
            body = wire.error_body(413, f"Request body exceeds {engine.settings.max_body_bytes} bytes.")
            return json_response(body, status=413)
        except RequestPayloadError as exc:  # a Content-Encoding that is not what it says: the client's 400
            engine.metrics.request(400)
            reason = getattr(exc.__cause__, "message", None) or str(exc) or "malformed body"
            return json_response(wire.error_body(400, f"Request body could not be read: {reason}"), status=400)
        tracked = engine.settings.enable_server_load_tracking
        if tracked:  # as vLLM's load_aware_call: counted once the body is parsed, until the last byte
            engine.server_load += 1
        try:
            return await answer(request, engine, raw, arrived)
        finally:
            if tracked:
                engine.server_load -= 1

    return handler


async def _admitted_chat(request: web.Request, engine: SimEngine, raw: bytes,
                         arrived: float) -> web.StreamResponse:
    try:
        admitted = await engine.admit(raw)
    except SimError as exc:
        return _error(engine, exc)
    return await _answer(request, engine, admitted, arrived)


async def _messages(request: web.Request, engine: SimEngine, raw: bytes, arrived: float) -> web.StreamResponse:
    """``POST /v1/messages``: checked and mapped onto chat, answered by the chat path, the answer
    mapped back (``messages_api``); errors in vLLM's shapes for this endpoint."""
    admitted = await _admitted_messages(engine, raw, count_tokens=False)
    if isinstance(admitted, web.Response):
        return admitted
    return await _answer(request, engine, admitted, arrived, shape=messages_api.message_from_chat,
                         frame=messages_api.Frames())


async def _count_tokens(request: web.Request, engine: SimEngine, raw: bytes, arrived: float) -> web.StreamResponse:
    """``POST /v1/messages/count_tokens``: the mapped request's prompt tokens, images processed."""
    admitted = await _admitted_messages(engine, raw, count_tokens=True)
    if isinstance(admitted, web.Response):
        return admitted
    engine.metrics.request(200)
    return json_response(messages_api.counted(admitted.prompt_tokens))


async def _admitted_messages(engine: SimEngine, raw: bytes, *, count_tokens: bool) -> Admitted | web.Response:
    """A Messages request mapped and admitted, or the error answer in vLLM's shape for it."""
    try:
        return await engine.admit_body(messages_api.to_chat(raw, count_tokens=count_tokens))
    except messages_api.Refused as exc:
        engine.metrics.request(exc.status)
        return json_response(exc.body, status=exc.status)
    except SimError as exc:
        engine.metrics.request(exc.status)
        return json_response(messages_api.error_body(exc), status=exc.status)


Shape = Callable[[dict[str, Any]], dict[str, Any]]
Frame = Callable[[bytes], bytes]


async def _answer(request: web.Request, engine: SimEngine, admitted: Admitted, arrived: float, *,
                  shape: Shape | None = None, frame: Frame | None = None) -> web.StreamResponse:
    """The admitted chat request answered, whole (its body through ``shape``) or streamed (each
    frame through ``frame``): the Messages API's answer is the chat answer mapped."""
    engine.metrics.tokens(admitted.prompt_tokens, 0)
    engine.metrics.running(+1)
    try:
        if admitted.request.stream:
            return await _stream(request, engine, admitted, arrived, frame or (lambda data: data))
        return await _complete(request, engine, admitted, arrived, shape or (lambda body: body))
    finally:
        engine.metrics.running(-1)


def _ids(request: web.Request) -> tuple[str, int]:
    """The completion's id and time: ``chatcmpl-`` and the request's ``X-Request-Id`` when it has one,
    as vLLM names it (so one id follows a request from the gateway into the engine), else a random one."""
    return f"chatcmpl-{request.headers.get('X-Request-Id') or uuid.uuid4().hex}", int(time.time())


async def _complete(request: web.Request, engine: SimEngine, admitted: Admitted, arrived: float,
                    shape: Shape) -> web.Response:
    n = admitted.completion_tokens
    first_token_at = engine.first_token_at(arrived, admitted.prefill_s)
    await sleep_until(first_token_at + max(0, admitted.longest - 1) * admitted.decode_s)
    request_id, created = _ids(request)
    body = wire.completion(
        request_id=request_id, created=created, model=admitted.request.model,
        choices=[(p.text, p.finish_reason, p.stop_reason) for p in admitted.plans],
        prompt_tokens=admitted.prompt_tokens, completion_tokens=n,
    )
    engine.metrics.tokens(0, n)
    engine.metrics.success(admitted.plan.finish_reason)
    engine.metrics.request(200)
    return json_response(shape(body))


async def _stream(request: web.Request, engine: SimEngine, admitted: Admitted,
                  arrived: float, frame: Frame) -> web.StreamResponse:
    first_token_at = engine.first_token_at(arrived, admitted.prefill_s)
    request_id, created = _ids(request)
    writer = wire.ChunkWriter(
        request_id=request_id, created=created, model=admitted.request.model,
        prompt_tokens=admitted.prompt_tokens, include_usage=admitted.request.include_usage,
        continuous_usage_stats=admitted.request.continuous_usage_stats,
    )
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    plans = admitted.plans
    sent = 0

    async def write(data: bytes) -> None:
        if mapped := frame(data):  # a mapped stream may have nothing to send for a chunk
            await resp.write(mapped)

    try:
        await sleep_until(first_token_at)
        for index in range(len(plans)):
            await write(writer.role(index))
        for i in range(admitted.longest):
            await sleep_until(first_token_at + i * admitted.decode_s)
            for index, plan in enumerate(plans):  # the choices decode together, step by step
                if i < len(plan.tokens):
                    last = i == len(plan.tokens) - 1
                    sent += 1
                    await write(writer.token(plan.tokens[i], sent, plan.finish_reason if last else None, index,
                                             plan.stop_reason if last else None))
        final = writer.final_usage(sent)
        if final is not None:
            await write(final)
        await write(wire.SSE_DONE)
        await resp.write_eof()
    except ConnectionResetError:  # the client went away mid-stream: stop generating
        engine.disconnected(sent)
        return resp
    except asyncio.CancelledError:  # the server cancels the handler of a client that went away
        engine.disconnected(sent)
        raise
    engine.metrics.tokens(0, sent)
    engine.metrics.success(admitted.plan.finish_reason)
    engine.metrics.request(200)
    return resp


async def _models(request: web.Request) -> web.Response:
    s = request.app[ENGINE_KEY].settings
    return json_response({
        "object": "list",
        "data": [{
            "id": s.model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "mmgate-sim",
            "root": s.model,
            "parent": None,
            "max_model_len": s.max_model_len,
        }],
    })


async def _health(_: web.Request) -> web.Response:
    return web.Response(status=200)


async def _load(request: web.Request) -> web.Response:
    return json_response({"server_load": request.app[ENGINE_KEY].server_load})


async def _metrics(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    return web.Response(body=engine.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})
