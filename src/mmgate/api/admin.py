"""vLLM's operator endpoints (sleep and wake, cache resets, weight updates, profiling, pause and
resume, ``collective_rpc``, LoRA loading, elastic EP, scale-out internals, …): refused unless the
request carries the operator's admin key.

Without ``--admin-key-file`` every one is refused (403); with it, a request that carries the key
(``X-Mmgate-Admin-Key``, or ``Authorization: Bearer <admin key>`` as a vLLM client sends its key)
goes to

* the backend named by ``X-Mmgate-Backend`` (its name, as ``/health`` lists it), relayed as it
  answers; or
* without that header, every backend at once, answered by the gateway with each backend's status
  and body: ``{"backends": [{"backend", "status", "body"}]}``, 200 when every backend answered 2xx,
  else 502. An operator action (sleep, reset a cache, load an adapter) is meant for the fleet.

Tenant keys play no part: the admin key is the operator's, apart from every client's.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web

from mmgate.api.edge import read_body
from mmgate.api.forward import FORWARDER_KEY, deliver
from mmgate.api.gateway import Gateway
from mmgate.api.lifecycle import tracked_handler
from mmgate.app_runtime import json_response
from mmgate.backends import Backend, BackendReply
from mmgate.errors import ForbiddenError, InvalidRequestError, MmgateError
from mmgate.metrics import OPERATOR_ROUTE

ADMIN_KEY = web.AppKey("admin_key", str)
ADMIN_HEADER = "X-Mmgate-Admin-Key"
BACKEND_HEADER = "X-Mmgate-Backend"
# Largest operator request body (a LoRA path, an RPC method name): these are not uploads.
MAX_OPERATOR_BODY = 1024 * 1024

# (method, path) of every operator endpoint of vLLM 0.32 (its routers under vllm/entrypoints:
# serve/dev, serve/profile, serve/lora, serve/elastic_ep, rl/online, scale_out, fault_tolerance).
OPERATOR_ENDPOINTS: tuple[tuple[str, str], ...] = (
    ("POST", "/sleep"), ("POST", "/wake_up"), ("GET", "/is_sleeping"), ("POST", "/release_kv_cache_memory"),
    ("POST", "/reset_prefix_cache"), ("POST", "/reset_mm_cache"), ("POST", "/reset_encoder_cache"),
    ("POST", "/collective_rpc"), ("GET", "/server_info"), ("GET", "/kv_event_sources"),
    ("GET", "/tokenizer_info"),
    ("POST", "/start_profile"), ("POST", "/stop_profile"),
    ("POST", "/v1/load_lora_adapter"), ("POST", "/v1/unload_lora_adapter"),
    ("POST", "/scale_elastic_ep"), ("POST", "/is_scaling_elastic_ep"),
    ("POST", "/pause"), ("POST", "/resume"), ("GET", "/is_paused"), ("POST", "/abort_requests"),
    ("POST", "/init_weight_transfer_engine"), ("POST", "/shutdown_weight_transfer_engine"),
    ("POST", "/start_weight_update"), ("POST", "/start_draft_weight_update"), ("POST", "/update_weights"),
    ("POST", "/finish_weight_update"), ("POST", "/update_weight_version"), ("GET", "/weight_info"),
    ("POST", "/weight_checker"), ("GET", "/get_world_size"),
    ("POST", "/fault_tolerance/apply"), ("GET", "/fault_tolerance/status"),
    ("POST", "/inference/v1/generate"), ("POST", "/inference/v1/abort_requests"),
    ("POST", "/v1/chat/completions/render"), ("POST", "/v1/completions/render"),
    ("POST", "/v1/messages/render"), ("POST", "/v1/responses/render"),
    ("POST", "/v1/chat/completions/derender"), ("POST", "/v1/completions/derender"),
)


def add_operator_endpoints(app: web.Application, admin_key: str | None) -> None:
    """Register every operator endpoint on ``app``, guarded by ``admin_key`` (None: all refused)."""
    if admin_key is not None:
        app[ADMIN_KEY] = admin_key
    handler = tracked_handler(OPERATOR_ROUTE, _operator)
    for method, path in OPERATOR_ENDPOINTS:
        app.router.add_route(method, path, handler)


def is_admin(request: web.Request) -> bool:
    """True when the gateway has an admin key and the request carries it (``X-Mmgate-Admin-Key``,
    or ``Authorization: Bearer <admin key>``, which is what a Prometheus scrape config sends)."""
    return carries_admin_key(request.app.get(ADMIN_KEY), request.headers)


def carries_admin_key(key: str | None, headers: Mapping[str, str]) -> bool:
    """``is_admin`` for a request's ``headers`` and the gateway's admin ``key`` (None: none set)."""
    if key is None:
        return False
    given = headers.get(ADMIN_HEADER) or headers.get("Authorization", "").removeprefix("Bearer ")
    return bool(given) and hmac.compare_digest(given.encode("utf-8", "replace"), key.encode())


def check_admin(request: web.Request) -> None:
    """403 unless the request carries the configured admin key."""
    key = request.app.get(ADMIN_KEY)
    if key is None:
        raise ForbiddenError(f"{request.path} is an operator endpoint: the gateway has no admin key "
                             "(--admin-key-file), so it is not reachable through the gateway")
    if not carries_admin_key(key, request.headers):
        raise ForbiddenError(f"{request.path} is an operator endpoint: send the gateway's admin key in "
                             f"{ADMIN_HEADER} (or Authorization: Bearer <admin key>)", param=ADMIN_HEADER)


async def _operator(request: web.Request, gateway: Gateway) -> tuple[web.StreamResponse, bool]:
    check_admin(request)
    raw = await read_body(request, max_bytes=min(MAX_OPERATOR_BODY, gateway.settings.max_body_bytes),
                          timeout_s=gateway.settings.body_timeout_s)
    headers = {"Content-Type": request.headers.get("Content-Type", "application/json")} if raw else None
    body = raw if raw or request.method != "GET" else None
    target = request.headers.get(BACKEND_HEADER)
    router = gateway.router
    if target is not None:
        backend = next((b for b in router.backends if b.name == target), None)
        if backend is None:
            raise InvalidRequestError(f"no backend named {target[:100]!r} (GET /health lists them)",
                                      param=BACKEND_HEADER)
        forwarded = await request.app[FORWARDER_KEY].send(
            request.method, request.path_qs, body, model=None, session_id=None, headers=headers,
            backends=[backend])
        try:
            return await deliver(request, forwarded.reply, forwarded.headers, gateway)
        finally:
            forwarded.close()
    results = await asyncio.gather(
        *(_one(b, request.method, request.path_qs, body, headers) for b in router.backends))
    ok = all(200 <= r["status"] < 300 for r in results)
    return json_response({"backends": results}, status=200 if ok else 502), True


async def _one(backend: Backend, method: str, path: str, body: bytes | None,
               headers: dict[str, str] | None) -> dict[str, Any]:
    """One backend's answer to an operator request, as the fan-out reports it."""
    try:
        reply: BackendReply = await backend.request(method, path, body=body, headers=headers, stream=False)
    except MmgateError as exc:
        return {"backend": backend.name, "status": exc.status, "body": exc.to_body()}
    data = reply.body or b""
    try:
        parsed: Any = orjson.loads(data) if data else None
    except orjson.JSONDecodeError:
        parsed = data[:4096].decode("utf-8", "replace")
    return {"backend": backend.name, "status": reply.status, "body": parsed}
