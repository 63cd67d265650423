"""A real OTLP/HTTP trace receiver on loopback: an aiohttp server that accepts
``POST /v1/traces`` (protobuf) and decodes each export with opentelemetry-proto."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from mmgate.app_runtime import start_app


@dataclass
class Span:
    """One received span, its ids as hex."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    attributes: dict[str, Any]
    service: str


@dataclass
class Receiver:
    url: str = ""
    spans: list[Span] = field(default_factory=list)
    content_types: list[str] = field(default_factory=list)

    def named(self, name: str) -> list[Span]:
        return [s for s in self.spans if s.name == name]


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@asynccontextmanager
async def otlp_receiver() -> AsyncIterator[Receiver]:
    receiver = Receiver()

    async def traces(request: web.Request) -> web.Response:
        receiver.content_types.append(request.content_type)
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.read())
        for resource_spans in export.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    receiver.spans.append(Span(
                        name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex(), kind=s.kind,
                        attributes={a.key: _value(a.value) for a in s.attributes},
                        service=str(resource.get("service.name"))))
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner, port = await start_app(app, "127.0.0.1", 0)
    receiver.url = f"http://127.0.0.1:{port}/v1/traces"
    try:
        yield receiver
    finally:
        await runner.cleanup()
