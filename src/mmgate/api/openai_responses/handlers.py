"""The OpenAI Responses API through the gateway: ``POST /v1/responses``, ``GET`` and ``POST …/cancel``
``/v1/responses/{id}``.

A create runs the chat pipeline (policy, load, uuids, strip repeats, route, heal) with its body
POSTed to the backend's own ``/v1/responses`` (``mmgate.api.openai_responses.parse`` says why
that keeps reuse); the reply — body or event stream — comes back unchanged. The response's id is
recorded with the backend that made it (``ResponseHomes``) so stored-response requests reach it;
a follow-up (``previous_response_id``) is pinned to that backend: no other one is tried.

With tenants, each response is named by the gateway for its tenant (``mmgate.response_ids``): an id
that is not the requesting tenant's — in the path or in ``previous_response_id`` — is answered
exactly as an id no backend holds (404), and a client's own ``request_id`` (vLLM's name for the
response) is refused.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator

import orjson
from aiohttp import web

from mmgate.api.edge import read_body
from mmgate.api.error_responses import error_frame
from mmgate.api.forward import Forwarder
from mmgate.api.forward import deliver as forward_deliver
from mmgate.api.gateway import Gateway
from mmgate.api.lifecycle import deliver, request_tenant, tracked
from mmgate.api.openai_responses.homes import ResponseHomes
from mmgate.api.openai_responses.parse import parse_responses_body
from mmgate.backends import Backend
from mmgate.errors import InvalidRequestError, ResponseNotFoundError, UpstreamError
from mmgate.jsonbody import loads_body
from mmgate.response_ids import is_tenants_response, mint_response_id

RESPONSES_PATH = "/v1/responses"
STORED_ROUTE = RESPONSES_PATH + "/{response_id}"
# How far into a stream the response id is looked for (it is in the first event).
_ID_SCAN_BYTES = 64 * 1024
_STREAM_ID = re.compile(rb'"response":\s*\{"id":\s*"([^"]{1,200})"')
# How long the lookup of an unrecorded id waits for each backend (they are asked together).
PROBE_TIMEOUT_S = 5.0
_RESPONSE_ID = re.compile(r"[A-Za-z0-9_\-]{1,200}")


class ResponsesService:
    """One gateway's Responses endpoints and its response-id → backend map."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.homes = ResponseHomes()

    async def create(self, request: web.Request) -> web.StreamResponse:
        gateway = self.gateway
        settings = gateway.settings

        async def work() -> tuple[web.StreamResponse, bool]:
            tenant = request_tenant(request, gateway)
            raw = await read_body(request, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s,
                              max_inflation_ratio=settings.max_inflation_ratio,
                          inflate_pool=gateway.inflate_pool)
            tag = None if tenant is None else gateway.keys.tenant_tag(tenant)
            held = gateway.loader.held_images(gateway.session_id(request.headers), tag)  # as chat's parse
            try:
                body = await loads_body(raw, held)
            except orjson.JSONDecodeError as exc:
                raise InvalidRequestError(f"request body is not valid JSON: {exc}") from exc
            models = gateway.router.models
            parsed = parse_responses_body(
                body, max_images=settings.max_images_per_request, max_uuid_length=settings.max_uuid_length,
                max_depth=settings.max_json_depth, default_model=models[0] if len(models) == 1 else None,
            )
            if tag is not None:
                if body.get("request_id") is not None:
                    raise InvalidRequestError(
                        "'request_id' is not accepted with API keys: the gateway names each response for its "
                        "tenant (vLLM names a response by its request_id)", param="request_id")
                body["request_id"] = mint_response_id(tag)
            for i, url in parsed.tool_urls:  # a URL a backend may connect to: the URL policy first
                body["tools"][i]["server_url"] = await gateway.loader.check_passthrough(
                    url, param=f"tools[{i}].server_url", kind="mcp server_url")
            pin = None
            if parsed.previous_response_id is not None:
                pin = await self.locate(parsed.previous_response_id, param="previous_response_id", tenant_tag=tag)
            outcome = await gateway.chat_parsed(parsed.chat, request.headers, tenant, path=RESPONSES_PATH, pin=pin)
            name = outcome.backend.name
            try:
                reply = outcome.reply
                if reply.stream is None:
                    self._record_body(reply.body, name)
                    return await deliver(request, gateway, headers=outcome.headers, error_frame=error_frame,
                                         body=reply.body)
                stream = self._recording(reply.stream, name)  # the backend's chunks, one for one
                return await deliver(request, gateway, headers=outcome.headers, error_frame=error_frame, stream=stream,
                                     arrived=reply.stream_arrived(), is_last=lambda _: reply.stream_ended())
            finally:
                outcome.close()

        return await tracked(gateway, RESPONSES_PATH, work)

    async def retrieve(self, request: web.Request) -> web.StreamResponse:
        """``GET /v1/responses/{id}`` (query kept: ``stream``, ``starting_after``) from the response's home."""
        return await tracked(self.gateway, STORED_ROUTE, lambda: self._stored(request, "GET", ""))

    async def cancel(self, request: web.Request) -> web.StreamResponse:
        return await tracked(self.gateway, STORED_ROUTE + "/cancel", lambda: self._stored(request, "POST", "/cancel"))

    async def _stored(self, request: web.Request, method: str, suffix: str) -> tuple[web.StreamResponse, bool]:
        gateway = self.gateway
        tenant = request_tenant(request, gateway)
        response_id = request.match_info["response_id"]
        if not _RESPONSE_ID.fullmatch(response_id):
            raise InvalidRequestError("the response id must be 1-200 letters, digits, '_' or '-'", param="response_id")
        tag = None if tenant is None else gateway.keys.tenant_tag(tenant)
        backend = await self.locate(response_id, param="response_id", tenant_tag=tag)
        stream = request.query.get("stream", "").lower() == "true"
        path = f"{RESPONSES_PATH}/{response_id}{suffix}"
        if request.rel_url.raw_query_string:  # as the client encoded it (decoded, an escaped '#' ends it)
            path += "?" + request.rel_url.raw_query_string
        forwarded = await Forwarder(gateway).send(method, path, None, model=None, session_id=None, stream=stream,
                                                  backends=[backend])
        try:  # any status relayed as vLLM wrote it (a cancel of a finished response: its 400)
            return await forward_deliver(request, forwarded.reply, forwarded.headers, gateway)
        finally:
            forwarded.close()

    async def locate(self, response_id: str, *, param: str, tenant_tag: str | None = None) -> Backend:
        """The backend holding ``response_id``: the recorded one, else the one that answers for it.
        With ``tenant_tag``, an id not minted for that tenant is unknown (the same 404)."""
        if tenant_tag is not None and not is_tenants_response(response_id, tenant_tag):
            raise _not_found(response_id, param)
        router = self.gateway.router
        name = self.homes.home(response_id, time.monotonic())
        if name is not None:
            for backend in router.backends:
                if backend.name == name:
                    return backend
        healthy = [b for b in router.backends if router.is_healthy(b)]
        found = await asyncio.gather(*(self._holds(b, response_id) for b in healthy))
        for backend, holds in zip(healthy, found, strict=True):
            if holds:
                self.homes.record(response_id, backend.name, time.monotonic())
                return backend
        raise _not_found(response_id, param)

    async def _holds(self, backend: Backend, response_id: str) -> bool:
        """Whether ``backend`` answers ``GET /v1/responses/{id}`` with 200, within ``PROBE_TIMEOUT_S``."""
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                reply = await backend.request("GET", f"{RESPONSES_PATH}/{response_id}")
        except (UpstreamError, TimeoutError):
            return False  # that backend cannot say: the others may
        reply.release()
        return reply.status == 200

    def _record_body(self, body: bytes | None, backend: str) -> None:
        try:
            response_id = orjson.loads(body or b"").get("id")
        except (orjson.JSONDecodeError, AttributeError):  # not a response object: nothing to record
            return
        if isinstance(response_id, str):
            self.homes.record(response_id, backend, time.monotonic())

    async def _recording(self, stream: AsyncIterator[bytes], backend: str) -> AsyncIterator[bytes]:
        """``stream`` unchanged, its response id recorded from the first event."""
        head = b""
        scanning = True
        async for chunk in stream:
            if scanning:
                head += chunk
                found = _STREAM_ID.search(head)
                if found is not None:
                    self.homes.record(found.group(1).decode(), backend, time.monotonic())
                scanning = found is None and len(head) <= _ID_SCAN_BYTES
            yield chunk


def _not_found(response_id: str, param: str) -> ResponseNotFoundError:
    """The one answer for an id this tenant cannot reach: unknown, expired, or another tenant's."""
    return ResponseNotFoundError(
        f"Response with id '{response_id}' not found: no backend holds it (vLLM keeps a response only "
        "in the replica that made it, and only when started with VLLM_ENABLE_RESPONSES_API_STORE=1)",
        param=param,
    )


def register(app: web.Application, gateway: Gateway) -> None:
    """Add the Responses routes to ``app``."""
    service = ResponsesService(gateway)
    app[RESPONSES_KEY] = service
    app.router.add_post(RESPONSES_PATH, service.create)
    app.router.add_get(STORED_ROUTE, service.retrieve)
    app.router.add_post(STORED_ROUTE + "/cancel", service.cancel)


RESPONSES_KEY = web.AppKey("responses", ResponsesService)
