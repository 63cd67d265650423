"""The gateway's request observer, as aiohttp middleware: every request, on every route, gets a
request id (the client's ``X-Request-Id`` when safe, else a new one) returned on its answer,
errors included; a ``RequestRecord`` the pipeline notes into; a server span when tracing is on;
and, once its last byte went out, one access-log line and its per-tenant metrics.

The middleware is outermost, so it sees the answer the error middleware shaped. It sends a whole
response itself (``prepare`` + ``write_eof``, which aiohttp would do right after) so the line
carries the bytes really written and the time to the last byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from mmgate.metrics import GatewayMetrics
from mmgate.observe.access import (
    AccessLogFormat,
    StderrLines,
    access_logger,
    clip,
    formatter,
    line_writer,
)
from mmgate.observe.ids import REQUEST_ID_HEADER, TRACEPARENT_HEADER, request_id, valid_traceparent
from mmgate.observe.record import RequestRecord, bind, unbind
from mmgate.observe.tracing import EXPORT_TIMEOUT_S, Tracing
from mmgate.response_ids import redact_response_path

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
RECORD_KEY = web.RequestKey("mmgate.record", RequestRecord)
CLIENT_CLOSED = 499
# The tail of a whole JSON answer searched for its ``usage`` (vLLM writes it near the end).
_USAGE_TAIL = 64 * 1024


class Observer:
    """Access log, tracing and tenant metrics of one gateway (module docstring)."""

    def __init__(
        self, metrics: GatewayMetrics, *, access_log: AccessLogFormat, session_headers: tuple[str, ...],
        tracing: Tracing | None = None,
    ) -> None:
        self.metrics = metrics
        self.tracing = tracing
        self._format = formatter(access_log)
        self._logger = access_logger()
        self._write = line_writer(self._logger) if self._format is not None else None
        self._session_headers = session_headers
        self.middleware = web.middleware(functools.partial(Observer._observe, self))

    async def _observe(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        record = RequestRecord(request_id(request.headers.get(REQUEST_ID_HEADER)), request.method,
                               redact_response_path(request.path), time.perf_counter())
        request[RECORD_KEY] = record
        token = bind(record)
        response: web.StreamResponse | None = None
        status = 500
        try:
            if self.tracing is None:
                record.traceparent = valid_traceparent(request.headers.get(TRACEPARENT_HEADER))
                response = await handler(request)
                if not response.prepared:
                    await response.prepare(request)
                await response.write_eof()  # idempotent: a relayed stream has already ended
            else:
                with self.tracing.request(f"{request.method} {_route(request)}", request.headers,
                                          {"mmgate.request_id": record.request_id,
                                           "url.path": clip(record.path) or ""}) as trace:
                    record.tracer = trace
                    try:
                        response = await self._answer(request, handler)
                    finally:
                        self._end_trace(trace.server, request, record, response)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        except (asyncio.CancelledError, ConnectionError):
            status = CLIENT_CLOSED
            raise
        finally:
            unbind(token)
            self._finish(request, record, response, status)

    async def _answer(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        if not response.prepared:
            await response.prepare(request)
        await response.write_eof()  # idempotent: a relayed stream has already ended
        return response

    async def close(self, _: web.Application | None = None) -> None:
        """Write the access-log lines still gathered."""
        if isinstance(self._write, StderrLines):
            self._write.flush()

    @staticmethod
    async def on_prepare(request: web.Request, response: web.StreamResponse) -> None:
        """Every answer carries the request id; its head going out is the time to first byte."""
        record = request.get(RECORD_KEY)
        if record is not None:
            response.headers[REQUEST_ID_HEADER] = record.request_id
            record.mark_first_byte()

    def _finish(self, request: web.Request, record: RequestRecord, response: web.StreamResponse | None,
                status: int) -> None:
        bytes_out = 0
        backend = body = None
        if response is not None:
            bytes_out = response.body_length
            backend = response.headers.get("x-mmgate-backend")
            if response.status == 200:
                body = getattr(response, "body", None)  # a whole answer (streams were watched as relayed)
        self.finish(record, status, request.headers, bytes_in=request.content.total_bytes, bytes_out=bytes_out,
                    backend=backend, body=body if isinstance(body, bytes | bytearray) else None)

    def finish(self, record: RequestRecord, status: int, headers: Mapping[str, str], *, bytes_in: int,
               bytes_out: int, backend: str | None, body: bytes | bytearray | None) -> None:
        """One request is over: its tenant metrics and its access-log line. ``status``: what was
        sent (the route's own count in ``record.status`` wins: 499 for a stream cut short);
        ``bytes_out``: head and body as written; ``body``: a whole 200 answer, read for its usage."""
        if record.status is not None:
            status = record.status
        tenant = record.tenant  # the API layer's, once the request authenticated
        if body is not None and record.prompt_tokens is None and record.model is not None:
            record.note_usage(body[-_USAGE_TAIL:])
        self.metrics.tenant(tenant).observe(record, status, bytes_in, bytes_out)
        if self._format is None or self._write is None or not self._logger.isEnabledFor(logging.INFO):
            return
        first_byte = record.first_byte
        self._write(self._format((
            record.request_id, record.method, clip(record.path), status, tenant, self._session(headers),
            clip(record.model), backend, record.sent, record.stripped, record.referenced, record.healed, bytes_in,
            bytes_out, record.prompt_tokens, record.completion_tokens,
            None if first_byte is None else (first_byte - record.started) * 1000,
            (time.perf_counter() - record.started) * 1000)))

    def refused(self, request: web.BaseRequest, response: web.StreamResponse, elapsed_s: float) -> None:
        """A request no handler saw — aiohttp's own parser answered it (400) before any
        middleware ran: its access-log line and tenant count all the same."""
        if RECORD_KEY in request:  # the middleware saw it: logged already
            return
        record = RequestRecord(request_id(None), request.method, redact_response_path(request.path),
                               time.perf_counter() - elapsed_s)
        self.finish(record, response.status, {}, bytes_in=0, bytes_out=response.body_length, backend=None, body=None)

    def _session(self, headers: Mapping[str, str]) -> str | None:
        for name in self._session_headers:
            value = headers.get(name)
            if value:
                return clip(value)
        return None

    @staticmethod
    def _end_trace(server: Any, request: web.Request, record: RequestRecord,
                   response: web.StreamResponse | None) -> None:
        set_attribute = server.set_attribute
        set_attribute("http.response.status_code", record.status or (response.status if response else 500))
        tenant = record.tenant
        if tenant is not None:
            set_attribute("mmgate.tenant", tenant)
        if record.model is not None:
            set_attribute("gen_ai.request.model", record.model)
        if response is not None and (backend := response.headers.get("x-mmgate-backend")):
            set_attribute("mmgate.backend", backend)
        set_attribute("mmgate.images.sent", record.sent)
        set_attribute("mmgate.images.stripped", record.stripped)
        set_attribute("mmgate.images.healed", record.healed)


def _route(request: web.Request) -> str:
    """The route-table path that matched (``/v1/responses/{response_id}``), ``unmatched`` for none:
    a span name of bounded cardinality, as OpenTelemetry asks."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


OBSERVER_KEY = web.AppKey("observer", Observer)


def refusal_log(observer: Observer) -> type[AbstractAccessLogger]:
    """The ``access_log_class`` for the gateway's ``AppRunner``: aiohttp calls it for every
    request; it writes the line of each one only aiohttp's parser saw (``Observer.refused``)."""

    class RefusedRequests(AbstractAccessLogger):
        __slots__ = ()

        def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
            observer.refused(request, response, time)

    return RefusedRequests


def install(app: web.Application, observer: Observer) -> None:
    """``observer``'s hooks in ``app``, whose first middleware must be ``observer.middleware``."""
    app[OBSERVER_KEY] = observer
    app.on_response_prepare.append(observer.on_prepare)
    app.on_cleanup.append(observer.close)
    if observer.tracing is not None:
        tracing = observer.tracing

        async def close_tracing(_: web.Application) -> None:
            # Bounded: a collector that does not answer must not hold the shutdown.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.to_thread(tracing.close), EXPORT_TIMEOUT_S + 1)

        app.on_cleanup.append(close_tracing)
