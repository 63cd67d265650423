"""OpenTelemetry traces as a collector sees them: a real gateway exporting over OTLP/HTTP to a
real receiver on loopback (which decodes the protobuf), in front of a real sim engine behind a
recording proxy (to see the ``traceparent`` that reached the backend), images from a real origin."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import aiohttp
import orjson
from multidict import CIMultiDict

from mmgate.config import BackendSpec
from mmgate.observe.tracing import EXPORT_TIMEOUT_S
from tests.observe.otlp import otlp_receiver
from tests.support.gateway import gateway_settings, running_gateway, running_sims
from tests.support.images import make_image
from tests.support.origin import ImageOrigin
from tests.support.ports import free_port
from tests.support.recorder import recording_proxy

MODEL = "mmgate-sim-vl"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


def chat(*urls: str) -> bytes:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return orjson.dumps({"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": parts}]})


async def test_spans_reach_the_collector_and_the_trace_reaches_the_backend() -> None:
    origin = await ImageOrigin().start()
    try:
        first, second = origin.add("a.png", make_image("PNG", seed=1)), origin.add("b.png", make_image("PNG", seed=2))
        async with otlp_receiver() as receiver, running_sims(1) as sims, recording_proxy(sims[0].url) as proxy:
            settings = gateway_settings(backends=(BackendSpec(kind="vllm", url=proxy.url, name="replica-0"),),
                                        otlp_traces_endpoint=receiver.url)
            async with running_gateway(settings) as gw, aiohttp.ClientSession() as s:
                headers = {"Content-Type": "application/json", "X-Request-Id": "traced-1",
                           "traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"}
                async with s.post(gw.url + "/v1/chat/completions", data=chat(first, second), headers=headers) as r:
                    assert r.status == 200, await r.text()
                sent_first = CIMultiDict(proxy.headers[-1])
                # No traceparent: a new trace; the first image is now in the local tier.
                async with s.post(gw.url + "/v1/chat/completions", data=chat(first),
                                  headers={"Content-Type": "application/json"}) as r:
                    assert r.status == 200
                sent_second = CIMultiDict(proxy.headers[-1])
                async with s.get(gw.url + "/no/such/path/12345") as r:
                    assert r.status == 404
            # The gateway stopped: its exporter flushed everything.
    finally:
        await origin.stop()
    assert receiver.content_types and set(receiver.content_types) == {"application/x-protobuf"}
    (unmatched,) = receiver.named("GET unmatched")  # a bounded span name, whatever the path
    assert unmatched.attributes["http.response.status_code"] == 404
    assert unmatched.attributes["url.path"] == "/no/such/path/12345"
    servers = receiver.named("POST /v1/chat/completions")
    assert len(servers) == 2 and {s.service for s in receiver.spans} == {"mmgate"}
    traced = next(s for s in servers if s.trace_id == TRACE_ID)
    fresh = next(s for s in servers if s.trace_id != TRACE_ID)
    assert traced.parent_id == CLIENT_SPAN and traced.kind == 2  # SPAN_KIND_SERVER
    assert traced.attributes["mmgate.request_id"] == "traced-1"
    assert traced.attributes["url.path"] == "/v1/chat/completions"
    assert traced.attributes["http.response.status_code"] == 200
    assert traced.attributes["gen_ai.request.model"] == MODEL and traced.attributes["mmgate.backend"] == "replica-0"
    children = [s for s in receiver.spans if s.trace_id == TRACE_ID and s.parent_id == traced.span_id]
    assert sorted(s.name for s in children) == ["load", "load", "parse", "route", "send"]
    loads = [s for s in children if s.name == "load"]
    assert {s.attributes["mmgate.image.source"] for s in loads} == {"origin"}
    assert {s.attributes["mmgate.image.param"] for s in loads} == {"messages[0].content[0]",
                                                                    "messages[0].content[1]"}
    (send,) = [s for s in children if s.name == "send"]
    assert send.attributes["mmgate.backend"] == "replica-0"
    # The backend got the trace: same trace id, the send span as its parent; and the request id.
    assert sent_first["traceparent"] == f"00-{TRACE_ID}-{send.span_id}-01"
    assert sent_first["X-Request-Id"] == "traced-1"
    (fresh_load,) = [s for s in receiver.spans if s.trace_id == fresh.trace_id and s.name == "load"]
    assert fresh.parent_id == "" and fresh_load.attributes["mmgate.image.source"] == "local_hit"
    assert sent_second["traceparent"].split("-")[1] == fresh.trace_id


async def test_without_an_endpoint_the_clients_trace_context_is_passed_on() -> None:
    async with running_sims(1) as sims, recording_proxy(sims[0].url) as proxy:
        settings = gateway_settings(backends=(BackendSpec(kind="vllm", url=proxy.url, name="replica-0"),))
        async with running_gateway(settings) as gw, aiohttp.ClientSession() as s:
            headers = {"Content-Type": "application/json", "traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"}
            async with s.post(gw.url + "/v1/chat/completions", data=chat(), headers=headers) as r:
                assert r.status == 200
            passed_on = CIMultiDict(proxy.headers[-1])
            headers["traceparent"] = f"00-{TRACE_ID}-{'0' * 16}-01"  # invalid (a zero parent id): dropped
            async with s.post(gw.url + "/v1/chat/completions", data=chat(), headers=headers) as r:
                assert r.status == 200
            dropped = CIMultiDict(proxy.headers[-1])
    # The gateway takes no part in the trace: the backend's spans join the client's span.
    assert passed_on["traceparent"] == f"00-{TRACE_ID}-{CLIENT_SPAN}-01" and len(passed_on["X-Request-Id"]) == 32
    assert "traceparent" not in dropped


async def test_a_collector_that_is_down_costs_spans_never_requests() -> None:
    closed = free_port()  # nothing listens there
    settings = gateway_settings(otlp_traces_endpoint=f"http://127.0.0.1:{closed}/v1/traces")
    started = time.monotonic()
    async with running_gateway(settings) as gw, aiohttp.ClientSession() as s:
        for _ in range(3):
            async with s.post(gw.url + "/v1/chat/completions", data=chat(),
                              headers={"Content-Type": "application/json"}) as r:
                assert r.status == 200
    assert time.monotonic() - started < EXPORT_TIMEOUT_S + 10  # the shutdown flush is bounded


def test_without_an_endpoint_no_tracer_is_loaded() -> None:
    """In a fresh interpreter (this one has the test receiver's imports): a gateway serving a
    request with a traceparent loads none of OpenTelemetry's tracing (its SDK, propagators or
    exporter). redis-py 8 itself imports OpenTelemetry's metrics API when the package is
    installed (``opentelemetry.trace`` and metrics included); that is its observability hook, off
    unless configured, and not looked at here."""
    script = textwrap.dedent('''
        import asyncio, sys, urllib.request
        from tests.support.gateway import gateway_settings, running_gateway

        async def main():
            async with running_gateway(gateway_settings()) as gw:
                request = urllib.request.Request(
                    gw.url + "/v1/chat/completions", method="POST",
                    data=b'{"model":"mmgate-sim-vl","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}',
                    headers={"Content-Type": "application/json",
                             "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
                status = await asyncio.to_thread(lambda: urllib.request.urlopen(request, timeout=30).status)
            tracing = ("opentelemetry.sdk.trace", "opentelemetry.exporter",
                       "opentelemetry.trace.propagation.tracecontext")
            print(status, sorted(m for m in sys.modules if m.startswith(tracing)))

        asyncio.run(main())
    ''')
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "200 []"
