"""The Anthropic Messages API through the gateway: ``POST /v1/messages`` and
``POST /v1/messages/count_tokens``, answered in Anthropic's shapes (errors included).

A create is mapped onto chat completions (``mmgate.anthropic_chat.request``), runs the gateway's
chat pipeline — every image loaded under the URL policy and limits, given its content uuid,
stripped to a cache-only reference on repeats, healed on a miss — and its reply is mapped back
(``reply``, ``stream``). vLLM's own ``/v1/messages`` cannot take a reference (it builds its image
parts without a uuid), hence the mapping. A request the mapping cannot carry faithfully, and
count_tokens (which generates nothing), go to the backend's own endpoint as they are, each image
first loaded under the same policy and limits (the request's pixel budget, the tenant's key space)
and re-sent as the validated bytes (``_police``); with API keys a forwarded create carries the
tenant's ``cache_salt``, as a mapped one does (``mmgate.reuse.namespace``).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, TypeVar

import orjson
from aiohttp import web

from mmgate.anthropic_chat.reply import message_from_chat
from mmgate.anthropic_chat.request import (
    HeldURL,
    check_messages_body,
    forward_reason,
    has_inline_system,
    image_sources,
    is_disabled_thinking,
    source_url,
    to_chat_body,
)
from mmgate.anthropic_chat.stream import StreamMapper
from mmgate.api.anthropic.reply import error_body, error_event, relayed_error, unserved
from mmgate.api.anthropic.stream import events, whole_events
from mmgate.api.anthropic.template_probes import TemplateProbes
from mmgate.api.chat_request import ChatRequest, check_depth, parse_chat_body
from mmgate.api.edge import read_body
from mmgate.api.forward import Forwarder
from mmgate.api.forward import deliver as forward_deliver
from mmgate.api.gateway import Gateway
from mmgate.api.lifecycle import deliver, request_tenant, tracked
from mmgate.api.police import refuse_transfer_params
from mmgate.app_runtime import json_response
from mmgate.config import GatewaySettings
from mmgate.errors import (
    BackendProtocolError,
    EndpointNotFoundError,
    InvalidRequestError,
    MmgateError,
)
from mmgate.jsonbody import dumps_body, loads_sized
from mmgate.metrics import UNMATCHED_ROUTE
from mmgate.reuse import client_cache_salt

_JSON = {"Content-Type": "application/json"}
MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
PATHS = frozenset({MESSAGES_PATH, COUNT_TOKENS_PATH})  # whose every error is in Anthropic's shape
Work = Callable[[], Awaitable[tuple[web.StreamResponse, bool]]]
_T = TypeVar("_T")
# A body with at least this much text outside its big strings (~2,500 blocks: tens of ms of pure
# Python) is checked and mapped in a thread (``_run``); an agent's turn of big images (~1 KB of it)
# stays on the loop, where the trip to a thread and back would cost more than its checks.
OFF_LOOP_BYTES = 64 * 1024


class _Body(NamedTuple):
    """A request's tenant, its checked body, whether it is large (its checks ran off the loop), and
    the data URLs of its image sources the gateway holds (``source_url``'s ``held``)."""

    tenant: str | None
    body: dict[str, Any]
    large: bool
    held: HeldURL


class MessagesService:
    """One gateway's Anthropic Messages endpoints."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.templates = TemplateProbes()

    async def create(self, request: web.Request) -> web.StreamResponse:
        return await tracked(self.gateway, MESSAGES_PATH, _anthropic_errors(lambda: self._create(request)))

    async def count_tokens(self, request: web.Request) -> web.StreamResponse:
        return await tracked(self.gateway, COUNT_TOKENS_PATH, _anthropic_errors(lambda: self._count_tokens(request)))

    async def wrong_method(self, request: web.Request) -> web.StreamResponse:
        """405 for a method other than POST, counted as the gateway counts unmatched routes."""
        self.gateway.metrics.observe(UNMATCHED_ROUTE, 405, 0.0)
        error = EndpointNotFoundError(f"the gateway does not serve {request.method[:16]} {request.path}: send POST",
                                      param="method")
        error.status = 405
        return json_response(error_body(error), status=405, headers={"Allow": "POST"})

    async def not_served(self, request: web.Request) -> web.StreamResponse:
        """404 for a path under /v1/messages/ the gateway does not serve, counted as unmatched."""
        self.gateway.metrics.observe(UNMATCHED_ROUTE, 404, 0.0)
        shown = request.path if len(request.path) <= 200 else request.path[:200] + "…"
        return error_response(EndpointNotFoundError(
            f"the gateway does not serve {shown} (docs/ENDPOINTS.md lists what it serves)", param="path"))

    async def _body(self, request: web.Request, *, count_tokens: bool = False) -> _Body:
        gateway = self.gateway
        settings = gateway.settings
        tenant = request_tenant(request, gateway)
        session_id = gateway.session_id(request.headers)
        raw = await read_body(request, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s,
                              max_inflation_ratio=settings.max_inflation_ratio,
                              inflate_pool=gateway.inflate_pool)
        # The parse finds the images resent in the request's own space among the held ones, as chat's.
        held = gateway.loader.held_images(session_id, None if tenant is None else gateway.keys.tenant_tag(tenant))
        try:
            body, skeleton = await loads_sized(raw, held)
        except orjson.JSONDecodeError as exc:
            raise InvalidRequestError(f"request body is not valid JSON: {exc}") from exc
        large = skeleton >= OFF_LOOP_BYTES  # many blocks, not an agent turn's few big images
        checked = await _run(large, _checked, body, settings.max_json_depth, count_tokens)
        return _Body(tenant, checked, large, held.data_url)

    async def _create(self, request: web.Request) -> tuple[web.StreamResponse, bool]:
        gateway = self.gateway
        tenant, body, large, held = await self._body(request)
        candidates = gateway.router.candidates(body["model"])  # an unknown model is a 404 first, as on vLLM
        # Refused on either path (chat_parsed for a mapped request), before a backend is asked anything.
        refuse_transfer_params(body, gateway.settings.allow_transfer_params)
        # What the replicas' chat template makes of these: probed as vLLM probes it, on every
        # replica the request could go to.
        effort, merge = None, None
        disabled, inline = is_disabled_thinking(body), has_inline_system(body)
        if disabled or inline:
            asked = [b for b in candidates if gateway.router.is_healthy(b)] or candidates[:1]
            if disabled:
                effort = await self.templates.disabled_effort(body["model"], asked)
            if inline:
                merge = await self.templates.merges_inline_system(body["model"], asked)
        if (reason := forward_reason(body, effort, merge)) is not None:
            if tenant is not None:  # vLLM salts its prefix cache with it: one partition per tenant
                body["cache_salt"] = gateway.keys.cache_salt(tenant, client_cache_salt(body))
            return await self._forward(request, body, tenant, held, MESSAGES_PATH, stream=bool(body.get("stream")),
                                       reason=reason)
        parsed = await _run(large, _mapped, body, gateway.settings, effort, bool(merge), held)
        outcome = await gateway.chat_parsed(parsed, request.headers, tenant)
        try:
            reply = outcome.reply
            if reply.stream is not None:
                mapper = StreamMapper()  # its last event and the stream's end leave in one write
                return await deliver(request, gateway, headers=outcome.headers, error_frame=error_event,
                                     stream=events(reply.stream, mapper), arrived=reply.stream_arrived(),
                                     is_last=lambda _: mapper.done)
            try:
                message = message_from_chat(orjson.loads(reply.body or b""))
            except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
                raise BackendProtocolError(f"backend {outcome.backend.name} sent a chat reply that is not "
                                           f"a chat completion: {exc}") from exc
            return await deliver(request, gateway, headers=outcome.headers, error_frame=error_event,
                                 body=orjson.dumps(message))
        finally:
            outcome.close()

    async def _count_tokens(self, request: web.Request) -> tuple[web.StreamResponse, bool]:
        tenant, body, _, held = await self._body(request, count_tokens=True)
        return await self._forward(request, body, tenant, held, COUNT_TOKENS_PATH, stream=False)

    async def _forward(
        self, request: web.Request, body: dict[str, Any], tenant: str | None, held: HeldURL, path: str, *,
        stream: bool, reason: str | None = None,
    ) -> tuple[web.StreamResponse, bool]:
        """``body`` to the backend's own ``path``, its images policed and inlined first; the
        backend's answer, any status, relayed as it is (an error in Anthropic's shape:
        ``relayed_error``), a stream in whole events (``whole_events``). A backend that does not
        serve ``path`` gets the client an error naming what made the gateway forward the request
        (``reason``, from ``forward_reason``), not its bare 404 (``unserved``)."""
        gateway = self.gateway
        session_id = gateway.session_id(request.headers)
        gateway.router.candidates(body["model"])  # an unknown model is a 404 before any image is loaded
        await self._police(body, session_id, tenant, held)
        forwarded = await Forwarder(gateway).send(
            "POST", path, await dumps_body(body), model=body["model"], session_id=session_id,
            headers=_JSON, stream=stream)
        try:
            headers = {**forwarded.headers, "x-mmgate-forwarded": "as-is"}
            reply = forwarded.reply
            if reply.stream is None:
                if (missing := unserved(reply.status, reply.body, path, forwarded.backend.name, reason)) is not None:
                    return error_response(missing), True
                if reply.status >= 400 and (shaped := relayed_error(reply.status, reply.body)) is not None:
                    reply.body, reply.content_type = shaped, "application/json"
                return await forward_deliver(request, reply, headers, gateway)
            # Its end checked and any failure told in Anthropic's shape, not the generic relay's.
            return await deliver(request, gateway, headers=headers, error_frame=error_event,
                                 stream=whole_events(reply.stream), status=reply.status)
        finally:
            forwarded.close()

    async def _police(self, body: dict[str, Any], session_id: str | None, tenant: str | None, held: HeldURL) -> None:
        """Load every image as the chat pipeline does — under the gateway's policy and limits, at
        once, charged to one pixel budget, in the tenant's key space — and make its source the
        validated bytes (base64), so the backend fetches nothing the client named. With tenants the
        bytes end with the tenant's mark (``tenant_marked``)."""
        sources = list(image_sources(body))
        gateway = self.gateway
        limit = gateway.settings.max_images_per_request
        if len(sources) > limit:
            raise InvalidRequestError(f"too many images: at most {limit} per request", param=sources[limit][0])
        tag = gateway.keys.tenant_tag(tenant) if tenant is not None else None
        images = await gateway.load_urls([(where, source_url(source, held)) for where, source in sources], session_id,
                                         tag)
        gateway.check_request_pixels(zip((where for where, _ in sources), images, strict=True))
        for (_, source), image in zip(sources, images, strict=True):
            data = image.data if tag is None else tenant_marked(image.data, tag)
            source.clear()
            source.update({"type": "base64", "media_type": image.mime, "data": base64.b64encode(data).decode("ascii")})


def tenant_marked(data: bytes, tag: str) -> bytes:
    """``data`` with the tenant's tag after the image's end. vLLM's Messages endpoint takes no uuid,
    and its processor cache keys an image by its bytes: unmarked, one tenant could time whether
    another had sent the same image. Decoders stop at the image's own end (PNG's IEND, JPEG's EOI,
    GIF's trailer, WebP's RIFF size, BMP's and TIFF's offsets), so the pixels are the same; a
    tenant's repeats carry the same mark and still hit."""
    return data + b"\x00mmgate-tenant:" + tag.encode("ascii")


def _checked(body: Any, max_depth: int, count_tokens: bool) -> dict[str, Any]:
    check_depth(body, max_depth)
    return check_messages_body(body, count_tokens=count_tokens)


def _mapped(body: dict[str, Any], settings: GatewaySettings, disabled_effort: str | None,
            merge_inline_system: bool, held: HeldURL) -> ChatRequest:
    """The chat request ``body`` maps to, parsed; its errors and image slots name the client's fields."""
    chat_body, params = to_chat_body(body, disabled_effort, merge_inline_system, held)
    try:
        parsed = parse_chat_body(chat_body, max_images=settings.max_images_per_request,
                                 max_uuid_length=settings.max_uuid_length, max_depth=settings.max_json_depth)
    except MmgateError as exc:
        exc.param = params.get(exc.param or "", exc.param)
        raise
    for slot in parsed.slots:
        slot.param = params.get(slot.param, slot.param)
    return parsed


async def _run(large: bool, work: Callable[..., _T], *args: Any) -> _T:
    """``work(*args)``: for a large body in a thread, so that walking its many blocks (pure Python,
    seconds for a body of a million small blocks) leaves the event loop serving everyone else."""
    return await asyncio.to_thread(work, *args) if large else work(*args)


def error_response(exc: MmgateError) -> web.Response:
    """``exc`` as the answer: its status, Anthropic's error body, ``Retry-After`` when it has one."""
    retry_after = getattr(exc, "retry_after_s", None)
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return json_response(error_body(exc), status=exc.status, headers=headers)


def _anthropic_errors(work: Work) -> Work:
    """``work`` with every ``MmgateError`` answered in Anthropic's error shape."""
    async def run() -> tuple[web.StreamResponse, bool]:
        try:
            return await work()
        except MmgateError as exc:
            return error_response(exc), True
    return run


def register(app: web.Application, gateway: Gateway) -> None:
    """Add the Messages routes to ``app``; any other method on them is a 405, any other path under
    ``/v1/messages/`` a 404, in Anthropic's shape."""
    service = MessagesService(gateway)
    for path, handler in ((MESSAGES_PATH, service.create), (COUNT_TOKENS_PATH, service.count_tokens)):
        app.router.add_post(path, handler)
        app.router.add_route("*", path, service.wrong_method)
    # The rest of the prefix (the SDK's batches): a 404 in its shape. A path registered in full
    # (the operator's /v1/messages/render) is matched before this one, whatever the order.
    app.router.add_route("*", MESSAGES_PATH + "/{rest:.*}", service.not_served)
