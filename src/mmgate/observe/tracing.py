"""OpenTelemetry traces, exported over OTLP (HTTP/protobuf) when ``--otlp-traces-endpoint`` is
set (vLLM's flag of the same name); without it none of OpenTelemetry's SDK is loaded and a
request costs one ``None`` check per span (``mmgate.observe.record.span``).

Each request is one server span (its parent the client's W3C ``traceparent`` when it sent one)
with children ``parse``, ``load`` (one per image, ``mmgate.image.source`` saying which cache tier
answered or that the origin was fetched), ``route`` and ``send``; the ``traceparent`` sent to the
backend names the span current at the send, so vLLM's own spans (``--otlp-traces-endpoint`` on the
replica) join the same trace. The OpenTelemetry packages are the ``otel`` extra.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from mmgate.errors import ConfigError

SERVICE_NAME = "mmgate"
# Seconds one export may take (a collector that is down or slow costs spans, never requests), and
# the flush at shutdown.
EXPORT_TIMEOUT_S = 5.0


class Tracing:
    """The gateway's tracer provider and exporter (one per gateway; ``close`` flushes)."""

    def __init__(self, endpoint: str, *, service_name: str = SERVICE_NAME) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace import SpanKind
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError as exc:  # the optional extra is missing: say which
            raise ConfigError("--otlp-traces-endpoint", "tracing needs the OpenTelemetry packages: "
                              "pip install 'mmgate[otel]'") from exc
        self._provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        exporter = OTLPSpanExporter(endpoint=endpoint, timeout=EXPORT_TIMEOUT_S)
        self._provider.add_span_processor(BatchSpanProcessor(exporter, export_timeout_millis=EXPORT_TIMEOUT_S * 1000))
        self._tracer = self._provider.get_tracer("mmgate")
        self._propagator = TraceContextTextMapPropagator()
        self._server_kind = SpanKind.SERVER

    @contextlib.contextmanager
    def request(self, name: str, headers: Mapping[str, str], attributes: dict[str, Any]) -> Iterator[RequestTrace]:
        """The server span of one request, child of the client's ``traceparent`` when valid."""
        parent = self._propagator.extract(headers)
        with self._tracer.start_as_current_span(name, context=parent, kind=self._server_kind,
                                                attributes=attributes) as server:
            yield RequestTrace(self, server)

    def close(self) -> None:
        """Export what is buffered and stop (blocking, at most about ``EXPORT_TIMEOUT_S``: call it
        off the event loop)."""
        self._provider.shutdown()


class RequestTrace:
    """One request's trace: the ``Tracer`` a ``RequestRecord`` holds."""

    __slots__ = ("_tracing", "server")

    def __init__(self, tracing: Tracing, server: Any) -> None:
        self._tracing = tracing
        self.server = server

    def span(self, name: str, attributes: dict[str, Any] | None = None) -> Any:
        return self._tracing._tracer.start_as_current_span(name, attributes=attributes)

    def inject(self, headers: dict[str, str]) -> None:
        self._tracing._propagator.inject(headers)

    def trace_id(self) -> str:
        return format(self.server.get_span_context().trace_id, "032x")
