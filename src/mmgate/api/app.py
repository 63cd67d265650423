"""The gateway's HTTP surface (aiohttp): the route table.

Chat completions (the reuse pipeline), vLLM's other client-facing endpoints
(``mmgate.api.endpoints``), its operator endpoints behind the admin key (``mmgate.api.admin``),
and what the gateway answers itself: ``/v1/models`` (every backend's model cards, merged),
``/health``, ``/ping``, ``/load``, ``/metrics``. Paths vLLM serves that the gateway will not
forward (``NOT_SERVED``) and paths nobody serves get a JSON 404 naming them. docs/ENDPOINTS.md
is the user's view of this table.

``build_app(gateway)`` wraps a built ``Gateway``; ``mmgate.serve.start_gateway`` builds one from
settings and serves it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from mmgate.api import agents, anthropic
from mmgate.api.admin import ADMIN_HEADER, ADMIN_KEY, add_operator_endpoints, is_admin
from mmgate.api.edge import read_body
from mmgate.api.endpoints import add_client_endpoints
from mmgate.api.error_responses import error_response, http_error_response
from mmgate.api.forward import FORWARDER_KEY, GATEWAY_KEY, Forwarder, deliver
from mmgate.api.gateway import Gateway
from mmgate.api.inflight_bodies import BODIES_KEY, InflightBodies
from mmgate.api.lifecycle import CLIENT_CLOSED, admitted, request_tenant, tracked_handler
from mmgate.api.tenant_slots import TenantSlots
from mmgate.app_runtime import json_response
from mmgate.backends import Backend, BackendReply
from mmgate.errors import EndpointNotFoundError, ForbiddenError, MmgateError
from mmgate.metrics import CHAT_ROUTE, UNMATCHED_ROUTE
from mmgate.observe.middleware import Observer, install
from mmgate.observe.tracing import Tracing

__all__ = ["CLIENT_CLOSED", "GATEWAY_KEY", "NOT_SERVED", "build_app"]

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Paths vLLM 0.32 serves that the gateway refuses for everyone, and why.
NOT_SERVED: dict[str, str] = {
    "/v1/chat/completions/batch": "batched chat requests are not served: send each conversation to "
    "/v1/chat/completions",
    "/invocations": "SageMaker's /invocations dispatches by body shape past the gateway's media policy: "
    "call the endpoint itself",
    "/cohere/v2/chat": "the Cohere chat API carries media the gateway does not police: use /v1/chat/completions",
    "/v2/embed": "the Cohere embed API carries media the gateway does not police: use /v1/embeddings",
    "/generative_scoring": "generative scoring is not served through the gateway",
    "/v1/systemone": "structured decisions are not served through the gateway",
    "/v1/realtime": "the realtime (WebSocket) API is not served through the gateway",
}
_MAX_SHOWN_PATH = 200


def _unknown(request: web.Request, status: int) -> EndpointNotFoundError:
    shown = request.path if len(request.path) <= _MAX_SHOWN_PATH else request.path[:_MAX_SHOWN_PATH] + "…"
    if status == 405:
        error = EndpointNotFoundError(f"the gateway does not serve {request.method} {shown}", param="method")
        error.status = 405
        return error
    return EndpointNotFoundError(f"the gateway does not serve {shown} (docs/ENDPOINTS.md lists what it serves)",
                                 param="path")


# Paths any client may call without an API key (probes, discovery, scrapes): outside the tenant limit.
METRICS_NEED_ADMIN_KEY = ("/metrics needs the gateway's admin key (X-Mmgate-Admin-Key, or Authorization: Bearer "
                          "<admin key> in the scrape config); with API keys and no --admin-key-file it is closed")
_OPEN_PATHS = frozenset({"/health", "/ping", "/load", "/metrics", "/v1/models", "/version"})
SLOTS_KEY = web.AppKey("tenant_slots", TenantSlots)


def _guard(gateway: Gateway, slots: TenantSlots | None, bodies: InflightBodies) -> Middleware:
    """The one middleware under the observer, one layer for its jobs:

    * with API keys, each tenant's requests in flight are capped (``--max-tenant-requests``);
    * the request bodies held at once are capped in bytes (``--max-body-bytes-in-flight``,
      ``mmgate.api.inflight_bodies``): what a request reserved is released when it ends;
    * every ``MmgateError`` and aiohttp HTTP error becomes an OpenAI-style error body (an
      ``MmgateError`` on the Messages paths an Anthropic one). Anything
      else is a bug of ours: aiohttp answers it with its plain 500 and logs the traceback.
    """

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            with bodies.scope(request), admitted(
                    gateway, slots, request.headers,
                    exempt=slots is None or request.path in _OPEN_PATHS or is_admin(request)):
                return await handler(request)
        except MmgateError as exc:  # its API's shape: a 401 or 429 on /v1/messages is Anthropic's
            return anthropic.error_response(exc) if request.path in anthropic.PATHS else error_response(exc)
        except web.HTTPException as exc:
            if exc.status in (404, 405):
                # Outside the route table (no handler counted it): a JSON error naming the path.
                gateway.metrics.observe(UNMATCHED_ROUTE, exc.status, 0.0)
                return error_response(_unknown(request, exc.status))
            return http_error_response(exc)

    return guard


def build_app(gateway: Gateway, *, admin_key: str | None = None) -> web.Application:
    """The aiohttp application around ``gateway``; ``admin_key`` opens the operator endpoints."""
    # The body cap is enforced by ``read_body`` (Content-Length up front, chunked bodies as they come).
    settings = gateway.settings
    tracing = Tracing(settings.otlp_traces_endpoint) if settings.otlp_traces_endpoint else None
    observer = Observer(gateway.metrics, access_log=settings.access_log, session_headers=settings.session_headers,
                        tracing=tracing)
    slots = TenantSlots(settings.max_tenant_requests) if gateway.tenants is not None and settings.max_tenant_requests \
        else None
    # The observer first: it sees every answer (errors shaped) and sends the request id on each.
    bodies = InflightBodies(settings.max_body_bytes_in_flight)
    app = web.Application(middlewares=[observer.middleware, _guard(gateway, slots, bodies)],
                          client_max_size=settings.max_body_bytes + 1)
    app[BODIES_KEY] = bodies
    install(app, observer)
    app.on_response_prepare.append(_vary_origin)
    if slots is not None:
        app[SLOTS_KEY] = slots
    if gateway.tenants is not None and admin_key is None:
        log.warning("/metrics is closed: API keys are set and no admin key is; to scrape it set "
                    "--admin-key-file (MMGATE_ADMIN_KEY_FILE) and send Authorization: Bearer <admin key>")
    app[GATEWAY_KEY] = gateway
    app[FORWARDER_KEY] = Forwarder(gateway)
    app.router.add_post(CHAT_ROUTE, tracked_handler(CHAT_ROUTE, _serve_chat))
    app[MODEL_CARDS_KEY] = _ModelCards(settings.health_interval_s)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/ping", _ping)
    app.router.add_post("/ping", _ping)
    app.router.add_get("/load", _load)
    app.router.add_get("/metrics", _metrics)
    agents.register(app, gateway)
    add_client_endpoints(app)
    add_operator_endpoints(app, admin_key)
    for path in NOT_SERVED:
        app.router.add_route("*", path, _not_served)
    return app


async def _vary_origin(_: web.Request, response: web.StreamResponse) -> None:
    """``Vary: Origin`` on every answer, as vLLM's CORS middleware sends it: a cache in front of
    the gateway keeps answers apart by ``Origin`` as it would in front of vLLM."""
    vary = response.headers.get("Vary")
    if vary is None:
        response.headers["Vary"] = "Origin"
    elif "origin" not in vary.lower():
        response.headers["Vary"] = vary + ", Origin"


async def _not_served(request: web.Request) -> web.StreamResponse:
    request.app[GATEWAY_KEY].metrics.observe(UNMATCHED_ROUTE, EndpointNotFoundError.status, 0.0)
    raise EndpointNotFoundError(f"{request.path}: {NOT_SERVED[request.path]}", param="path")


async def _serve_chat(request: web.Request, gateway: Gateway) -> tuple[web.StreamResponse, bool]:
    """One chat request: tenant, body, pipeline, delivery (its bookkeeping: ``tracked_handler``)."""
    started = time.perf_counter()
    settings = gateway.settings
    tenant = request_tenant(request, gateway)  # 401 before a byte of the body is read
    raw = await read_body(request, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s,
                          max_inflation_ratio=settings.max_inflation_ratio,
                          inflate_pool=gateway.inflate_pool)
    outcome = await gateway.chat(raw, request.headers, tenant=tenant)
    try:
        return await deliver(request, outcome.reply, outcome.headers, gateway,
                             on_first=lambda: gateway.metrics.first_chunk(time.perf_counter() - started))
    finally:
        # However delivery ended (done, client gone, cancelled): free the backend's connection
        # and its outstanding-request slot.
        outcome.close()


class _ModelCards:
    """The backends' model cards, asked for at most once per ``--health-interval`` however many
    clients list the models (the path is open without a key: one request must not fan out to
    every backend), concurrent listings sharing one round of asking."""

    def __init__(self, max_age_s: float) -> None:
        self.max_age_s = max_age_s
        self._cards: dict[str, dict[str, object]] = {}
        self._at = -max_age_s
        self._asking: asyncio.Task[dict[str, dict[str, object]]] | None = None

    async def get(self, backends: list[Backend], timeout_s: float) -> dict[str, dict[str, object]]:
        if time.monotonic() - self._at < self.max_age_s:
            return self._cards
        if self._asking is None or self._asking.done():
            self._asking = asyncio.create_task(self._ask(backends, timeout_s), name="mmgate-model-cards")
        return await asyncio.shield(self._asking)  # a client that leaves does not cancel the others'

    async def _ask(self, backends: list[Backend], timeout_s: float) -> dict[str, dict[str, object]]:
        cards: dict[str, dict[str, object]] = {}
        for listing in await asyncio.gather(*(_listing(b, timeout_s) for b in backends)):
            for card in listing:
                if isinstance(model := card.get("id"), str):
                    cards.setdefault(model, card)
        self._cards, self._at = cards, time.monotonic()
        return cards


MODEL_CARDS_KEY = web.AppKey("model_cards", _ModelCards)


async def _models(request: web.Request) -> web.StreamResponse:
    """Every model the fleet serves, each with the model card of the first backend (healthy ones
    first) that lists it (``_ModelCards``): vLLM's fields (``max_model_len``, ``root``, ``parent``,
    ``permission``, ...) kept; a model no backend describes right now gets a minimal card."""
    gateway = request.app[GATEWAY_KEY]
    router = gateway.router
    if not router.models:
        await router.refresh_models()
    cards = await request.app[MODEL_CARDS_KEY].get(request.app[FORWARDER_KEY].anywhere(),
                                                   gateway.settings.health_timeout_s)
    data = [cards.get(m) or {"id": m, "object": "model", "created": 0, "owned_by": "mmgate"} for m in router.models]
    return json_response({"object": "list", "data": data})


async def _listing(backend: Backend, timeout_s: float) -> list[dict[str, object]]:
    """The model cards ``backend`` lists, or none when it does not answer within ``timeout_s``."""
    try:
        async with asyncio.timeout(timeout_s):
            reply: BackendReply = await backend.request("GET", "/v1/models", stream=False)
    except (MmgateError, TimeoutError):
        return []  # a backend that does not answer describes nothing; the others still do
    if reply.status != 200 or not reply.body:
        return []
    try:
        data = orjson.loads(reply.body).get("data")
    except (orjson.JSONDecodeError, AttributeError):
        return []
    return [c for c in data if isinstance(c, dict)] if isinstance(data, list) else []


async def _ping(request: web.Request) -> web.StreamResponse:
    """vLLM's ``/ping`` (GET and POST): an empty 200 while a backend passes its health checks, else 503."""
    router = request.app[GATEWAY_KEY].router
    return web.Response(status=200 if any(router.is_healthy(b) for b in router.backends) else 503)


async def _load(request: web.Request) -> web.StreamResponse:
    """vLLM's ``/load`` for the gateway itself: its requests in flight to the backends."""
    router = request.app[GATEWAY_KEY].router
    return json_response({"server_load": sum(router.outstanding(b) for b in router.backends)})


async def _health(request: web.Request) -> web.StreamResponse:
    """200 while at least one backend passes its health checks, else 503. Lists each backend (name,
    URL, in-flight count) to the operator: to anyone on a gateway without API keys, else only to a
    request with the admin key; everyone else gets the counts, which is all a probe needs."""
    gateway = request.app[GATEWAY_KEY]
    router = gateway.router
    healthy = sum(1 for b in router.backends if router.is_healthy(b))
    body: dict[str, object] = {"status": "ok" if healthy else "degraded"}
    if gateway.tenants is None or is_admin(request):
        body["backends"] = [
            {"name": b.name, "kind": b.kind, "url": b.url, "healthy": router.is_healthy(b),
             "outstanding": router.outstanding(b)}
            for b in router.backends
        ]
    else:
        body["backends_healthy"], body["backends_total"] = healthy, len(router.backends)
    return json_response(body, status=200 if healthy else 503)


async def _metrics(request: web.Request) -> web.StreamResponse:
    """The Prometheus page; with an admin key configured or with API keys, only for a request
    that carries the admin key (per-backend and per-route counts say what other clients do, the
    ``mmgate_tenant_*`` labels name every tenant): API keys without an admin key shut it to all."""
    gateway = request.app[GATEWAY_KEY]
    if (request.app.get(ADMIN_KEY) is not None or gateway.tenants is not None) and not is_admin(request):
        raise ForbiddenError(METRICS_NEED_ADMIN_KEY, param=ADMIN_HEADER)
    return web.Response(body=generate_latest(gateway.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})
