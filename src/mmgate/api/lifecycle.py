"""One request's life in the gateway, the same for every API's handlers: admission, tracking, delivery.

``request_tenant`` and ``admitted`` authenticate the client and hold its tenant's slot;
``tracked`` (and ``tracked_handler``, an aiohttp handler around it) counts a request (in-flight set
drained at shutdown, status and latency metrics, 499 for a client that went away); ``deliver``
sends a whole body or relays an SSE stream for the APIs served beside chat completions (Messages,
Responses), ending a broken stream with an error frame in the API's own shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

from aiohttp import web

from mmgate.api.forward import GATEWAY_KEY, STREAM_HEADERS, open_stream, relay_stream
from mmgate.api.gateway import Gateway
from mmgate.api.tenant_slots import TenantSlots
from mmgate.errors import MmgateError, ShuttingDownError
from mmgate.observe import current
from mmgate.observe.middleware import CLIENT_CLOSED
from mmgate.observe.stream import observed_stream

log = logging.getLogger(__name__)
__all__ = ["CLIENT_CLOSED", "admitted", "deliver", "request_tenant", "tenant_of", "tracked", "tracked_handler"]
Served = Callable[[web.Request, Gateway], Awaitable[tuple[web.StreamResponse, bool]]]


def request_tenant(request: web.Request, gateway: Gateway) -> str | None:
    """The request's tenant (None without API keys), 401 for a missing or unknown key: the one
    the middleware already authenticated, else ``Gateway.authenticate`` now (kept on the request's
    record for its access-log line and tenant metrics)."""
    return tenant_of(gateway, request.headers)


def tenant_of(gateway: Gateway, headers: Mapping[str, str]) -> str | None:
    """``request_tenant`` for a request's ``headers``."""
    record = current()
    tenant = record.tenant if record is not None else None
    if tenant is None:
        tenant = gateway.authenticate(headers)
        if tenant is not None and record is not None:
            record.tenant = tenant
    return tenant


_FREE: contextlib.nullcontext[None] = contextlib.nullcontext()


def admitted(gateway: Gateway, slots: TenantSlots | None, headers: Mapping[str, str],
             *, exempt: bool = False) -> AbstractContextManager[None]:
    """The tenant limit around one request: with API keys and ``--max-tenant-requests``, the
    request is authenticated (401) and holds one of its tenant's slots (429 past the limit) for
    as long as the context lasts. ``exempt``: a request outside the limit (open paths, the admin
    key)."""
    if slots is None or gateway.tenants is None or exempt:
        return _FREE
    tenant = gateway.authenticate(headers)  # the 401 the handler would give, before the count
    assert tenant is not None  # tenants are configured: a key maps to one, or that was a 401
    if (record := current()) is not None:
        record.tenant = tenant  # for request_tenant, the access log and the tenant metrics
    return slots.hold(tenant)


ErrorFrame = Callable[[MmgateError], bytes]
# With vLLM's charset: its Messages and Responses streams say ``text/event-stream; charset=utf-8``.
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", **STREAM_HEADERS}


class _Answered(Protocol):
    @property
    def status(self) -> int: ...


Answer = TypeVar("Answer", bound=_Answered)


async def tracked(gateway: Gateway, route: str, work: Callable[[], Awaitable[tuple[Answer, bool]]], *,
                  task: asyncio.Task[Any] | None = None) -> Answer:
    """Run ``work`` (which returns the response and whether it went out complete) as one request
    of ``route`` (its route-table path, the metrics label); errors propagate to the caller's error
    shaping. ``task``: the one running this, when the caller knows it."""
    started = time.perf_counter()
    status = 500
    if task is None:
        task = asyncio.current_task()
    if task is not None:
        gateway.inflight.add(task)
    try:
        response, complete = await work()
        status = response.status if complete else CLIENT_CLOSED
        return response
    except MmgateError as exc:
        status = exc.status
        raise
    except web.HTTPException as exc:
        status = exc.status
        raise
    except asyncio.CancelledError:
        status = ShuttingDownError.status if gateway.stopping else CLIENT_CLOSED
        raise
    except ConnectionError:
        status = CLIENT_CLOSED
        raise
    finally:
        gateway.inflight.discard(task)
        gateway.metrics.observe(route, status, time.perf_counter() - started)
        if (record := current()) is not None:
            record.status = status


def tracked_handler(route: str, serve: Served) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """An aiohttp handler around ``serve``, run by ``tracked``: in flight for a graceful shutdown,
    its status and latency recorded under ``route`` (a bounded label)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        gateway = request.app[GATEWAY_KEY]
        return await tracked(gateway, route, lambda: serve(request, gateway))

    return handler


async def deliver(
    request: web.Request, gateway: Gateway, *, headers: dict[str, str], error_frame: ErrorFrame,
    body: bytes | None = None, stream: AsyncIterator[bytes] | None = None, status: int = 200,
    arrived: bool = False, is_last: Callable[[bytes], bool] | None = None,
) -> tuple[web.StreamResponse, bool]:
    """Send ``body`` whole, or relay ``stream`` frame by frame (``relay_stream``); returns the
    response and whether it went out complete (False: the client went away or stalled mid-stream).
    ``arrived``: whether ``stream``'s first frame is at hand (``open_stream``); ``is_last``:
    ``relay_stream``'s."""
    if stream is None:
        return web.Response(body=body, status=status, content_type="application/json", headers=headers), True
    started = time.perf_counter()
    response = await open_stream(request, status, {**SSE_HEADERS, **headers}, arrived=arrived)
    complete = await relay_stream(
        request, response, observed_stream(stream), gateway, error_frame=error_frame,
        on_first=lambda: gateway.metrics.first_chunk(time.perf_counter() - started), is_last=is_last)
    return response, complete
