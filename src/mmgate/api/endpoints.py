"""vLLM's client-facing endpoints besides chat completions, answered through the gateway.

The route table (``CLIENT_ENDPOINTS``) says how each is treated (docs/ENDPOINTS.md is the user's
view of it):

* ``json``: a JSON body, parsed once (only ``model`` is read for routing), its media fields
  policed (``mmgate.api.police``) and the body forwarded as it came — byte for byte when it cannot
  name a media field (``may_carry_media``), else as the gateway parsed and policed it; the reply
  relayed whole, or as an event stream when the backend streams (completions with ``stream:
  true``), without re-framing;
* ``json`` with ``pipeline``: a request with one chat conversation in ``messages`` runs the chat
  media pipeline (images loaded and namespaced by tenant, uuids, strips, heal) and its rewritten
  body is posted to the endpoint's own path (vLLM reads the uuids there); other shapes as ``json``;
* ``upload``: a multipart body (audio) streamed through under the body cap, never held whole;
  ``model`` is read from the form fields within its first ``UPLOAD_PEEK_BYTES``;
* ``get``: no body, about no model (``/version``): any backend, healthy first.

All go through the gateway's authentication (tenant keys), the router (model, session; health,
ejection, connect failover) and its body cap and deadline.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from aiohttp import web

from mmgate.api.edge import read_body
from mmgate.api.forward import FORWARDER_KEY, Upload, deliver
from mmgate.api.gateway import Gateway
from mmgate.api.lifecycle import request_tenant, tracked_handler
from mmgate.api.police import REFUSED_KEYS, may_carry_media, police, refuse_transfer_params, refused_key
from mmgate.errors import InvalidRequestError
from mmgate.jsonbody import loads_body
from mmgate.reuse import client_cache_salt

# Status counted for a client that went away before its answer was complete (nginx's convention).
# Bytes of a multipart upload read ahead for its ``model`` field (clients send fields before files).
UPLOAD_PEEK_BYTES = 64 * 1024
_FORM_MODEL = re.compile(
    rb'content-disposition:[ \t]*form-data;[ \t]*name="model"[^\r\n]*\r\n(?:[^\r\n]+\r\n)*\r\n(.{1,512}?)\r\n--',
    re.IGNORECASE | re.DOTALL,
)
_JSON = {"Content-Type": "application/json"}

Treatment = Literal["json", "upload", "get"]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One client-facing vLLM endpoint and how the gateway treats it (module docstring)."""

    path: str
    method: str
    treatment: Treatment
    pipeline: bool = False
    salted: bool = False  # vLLM reads a ``cache_salt`` here (its prefix cache): set per tenant
    # Top-level fields refused here (400 naming them): what vLLM reads there cannot be policed.
    refused: tuple[tuple[str, str], ...] = ()


# /pooling's ``data`` is an IO-processor plugin's input (vLLM's IOProcessorRequest): the plugin reads
# it as it likes — Prithvi's fetches a URL from it — so the gateway cannot police it.
_PLUGIN_DATA = ("data", "'data' (an IO-processor plugin's input) is not accepted through mmgate: the gateway "
                "cannot police what a plugin reads from it; send 'input' or 'messages'")


CLIENT_ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("/v1/completions", "POST", "json", salted=True),
    Endpoint("/tokenize", "POST", "json"),
    Endpoint("/detokenize", "POST", "json"),
    Endpoint("/v1/embeddings", "POST", "json", pipeline=True, salted=True),
    Endpoint("/pooling", "POST", "json", pipeline=True, salted=True, refused=(_PLUGIN_DATA,)),
    Endpoint("/classify", "POST", "json", salted=True),
    Endpoint("/score", "POST", "json", salted=True),
    Endpoint("/v1/score", "POST", "json", salted=True),
    Endpoint("/rerank", "POST", "json", salted=True),
    Endpoint("/v1/rerank", "POST", "json", salted=True),
    Endpoint("/v2/rerank", "POST", "json", salted=True),
    Endpoint("/v1/audio/transcriptions", "POST", "upload"),
    Endpoint("/v1/audio/translations", "POST", "upload"),
    Endpoint("/version", "GET", "get"),
)


def add_client_endpoints(app: web.Application) -> None:
    """Register every endpoint of ``CLIENT_ENDPOINTS`` on ``app``."""
    for endpoint in CLIENT_ENDPOINTS:
        serve = _SERVE[endpoint.treatment]

        async def run(request: web.Request, gateway: Gateway, endpoint: Endpoint = endpoint,
                      serve: Callable[..., Awaitable[tuple[web.StreamResponse, bool]]] = serve,
                      ) -> tuple[web.StreamResponse, bool]:
            return await serve(request, gateway, endpoint)

        app.router.add_route(endpoint.method, endpoint.path, tracked_handler(endpoint.path, run))


async def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object (400 otherwise), a large one parsed as chat's is
    (``loads_body``: the loop given back between its big strings)."""
    try:
        body = await loads_body(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidRequestError("request body must be a JSON object")
    return body


def refuse_unpoliced(body: dict[str, Any], endpoint: Endpoint) -> None:
    """400 naming a top-level field the gateway cannot police: the endpoint's ``refused`` ones and
    ``police.REFUSED_KEYS`` (checked here too: a pipeline request is not walked by ``police``)."""
    for field, message in endpoint.refused:
        if body.get(field) is not None:
            raise InvalidRequestError(message, param=field)
    for key in sorted(REFUSED_KEYS.intersection(body)):
        raise refused_key(key, key)


def model_of(body: dict[str, Any]) -> str | None:
    """The request's ``model``: None when absent or null (vLLM then serves its one model)."""
    model = body.get("model")
    if model is None:
        return None
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("'model' must be a non-empty string", param="model")
    return model


def is_conversation(messages: Any) -> bool:
    """True for one chat conversation (a non-empty list of message objects), not a batch of them."""
    return isinstance(messages, list) and bool(messages) and all(isinstance(m, dict) for m in messages)


def form_model(head: bytes) -> str | None:
    """The ``model`` field of a multipart form from the body's first bytes, or None."""
    match = _FORM_MODEL.search(head)
    if match is None:
        return None
    try:
        return match.group(1).decode("utf-8").strip() or None
    except UnicodeDecodeError as exc:
        raise InvalidRequestError("the 'model' form field must be UTF-8 text", param="model") from exc


async def _serve_json(request: web.Request, gateway: Gateway, endpoint: Endpoint) -> tuple[web.StreamResponse, bool]:
    settings = gateway.settings
    tenant = request_tenant(request, gateway)  # 401 before a byte of the body is read
    session_id = gateway.session_id(request.headers)
    raw = await read_body(request, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s,
                          max_inflation_ratio=settings.max_inflation_ratio,
                          inflate_pool=gateway.inflate_pool)
    body = await parse_json_object(raw)
    refuse_unpoliced(body, endpoint)
    refuse_transfer_params(body, settings.allow_transfer_params)
    model = model_of(body)
    forwarder = request.app[FORWARDER_KEY]
    if endpoint.pipeline and is_conversation(body.get("messages")):
        if model is None:
            # vLLM fills in its served model; the chat pipeline needs it named.
            body["model"] = forwarder.single_model()
            raw = orjson.dumps(body)
        outcome = await gateway.chat(raw, request.headers, tenant=tenant, path=endpoint.path)
        try:
            return await deliver(request, outcome.reply, outcome.headers, gateway)
        finally:
            outcome.close()
    if endpoint.salted and tenant is not None:  # vLLM's prefix cache, partitioned per tenant
        body["cache_salt"] = gateway.keys.cache_salt(tenant, client_cache_salt(body))
        raw = orjson.dumps(body)
    if may_carry_media(raw):
        async def check(url: str, param: str, kind: str) -> str:
            return await gateway.loader.check_passthrough(url, param=param, kind=kind)

        await police(body, check, max_uuid_length=settings.max_uuid_length, max_depth=settings.max_json_depth,
                     media=settings.media)
        # What was policed is sent, not the client's bytes: a duplicate key could hide a media field
        # there from the gateway's parser (the last wins) but not from a first-wins one.
        raw = orjson.dumps(body)
    forwarded = await forwarder.send("POST", request.path_qs, raw, model=model, session_id=session_id, headers=_JSON)
    try:
        return await deliver(request, forwarded.reply, forwarded.headers, gateway)
    finally:
        forwarded.close()


async def _serve_upload(request: web.Request, gateway: Gateway, endpoint: Endpoint) -> tuple[web.StreamResponse, bool]:
    settings = gateway.settings
    request_tenant(request, gateway)
    session_id = gateway.session_id(request.headers)
    upload = Upload(request, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s)
    model = form_model(await upload.peek(UPLOAD_PEEK_BYTES))
    headers = {"Content-Type": request.headers.get("Content-Type", "application/octet-stream")}
    if request.content_length is not None:
        headers["Content-Length"] = str(request.content_length)
    forwarded = await request.app[FORWARDER_KEY].send(
        "POST", request.path_qs, upload, model=model, session_id=session_id, headers=headers)
    try:
        return await deliver(request, forwarded.reply, forwarded.headers, gateway)
    finally:
        forwarded.close()


async def _serve_get(request: web.Request, gateway: Gateway, endpoint: Endpoint) -> tuple[web.StreamResponse, bool]:
    # Open without an API key, as on vLLM (its key guards /v1 paths only): ``app._OPEN_PATHS``.
    forwarder = request.app[FORWARDER_KEY]
    forwarded = await forwarder.send("GET", request.path_qs, None, model=None, session_id=None,
                                     backends=forwarder.anywhere())
    try:
        return await deliver(request, forwarded.reply, forwarded.headers, gateway)
    finally:
        forwarded.close()


_SERVE: dict[Treatment, Callable[..., Awaitable[tuple[web.StreamResponse, bool]]]] = {
    "json": _serve_json, "upload": _serve_upload, "get": _serve_get,
}
