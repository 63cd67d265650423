"""vLLM's other client-facing endpoints through a real gateway in front of real HTTP backends
(echo backends that describe what they received: ``tests.backends.echo_server``): forwarded as
they came, routed by model, streamed, errors relayed, media policed, unknown paths named."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from mmgate.app_runtime import start_app
from mmgate.config import BackendSpec
from mmgate.serve import RunningGateway
from tests.backends.echo_server import EchoBackend, echo_backend
from tests.support.gateway import gateway_settings, running_gateway

JSON_ENDPOINTS = ("/v1/completions", "/tokenize", "/detokenize", "/v1/embeddings", "/pooling", "/classify",
                  "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank")


@asynccontextmanager
async def fleet(models: tuple[tuple[str, ...], ...] = (("m1",), ("m1",)), **values: Any,
                ) -> AsyncIterator[tuple[RunningGateway, list[EchoBackend]]]:
    """A gateway in front of one echo backend per entry of ``models`` (the models each serves)."""
    backends: list[EchoBackend] = []
    async with echo_backend("e0", models[0]) as e0:
        backends.append(e0)
        async with echo_backend("e1", models[1] if len(models) > 1 else models[0]) as e1:
            if len(models) > 1:
                backends.append(e1)
            specs = tuple(BackendSpec(kind="vllm", url=b.url, name=b.name) for b in backends)
            async with running_gateway(gateway_settings(backends=specs, **values)) as gw:
                yield gw, backends


async def call(method: str, url: str, *, body: Any = None, raw: bytes | None = None,
               headers: dict[str, str] | None = None) -> tuple[int, Any, dict[str, str], bytes]:
    data = raw if raw is not None else (orjson.dumps(body) if body is not None else None)
    sent = {"Content-Type": "application/json", **(headers or {})} if data is not None else headers or {}
    async with aiohttp.ClientSession() as s, s.request(method, url, data=data, headers=sent) as r:
        payload = await r.read()
        try:
            decoded = orjson.loads(payload) if payload else None
        except orjson.JSONDecodeError:
            decoded = None
        return r.status, decoded, dict(r.headers), payload


async def test_every_json_endpoint_is_forwarded_byte_for_byte() -> None:
    async with fleet() as (gw, backends):
        raw = b'{"model": "m1",  "prompt": "hello", "extra_vllm_field": [1, 2]}'
        for path in JSON_ENDPOINTS:
            status, body, headers, _ = await call("POST", gw.url + path + "?q=1", raw=raw,
                                                   headers={"Authorization": "Bearer client-key"})
            assert status == 200, (path, body)
            assert body["path"] == path + "?q=1" and body["method"] == "POST" and body["bytes"] == len(raw)
            assert body["authorization"] is None  # the client's key never reaches a backend
            assert headers["x-mmgate-backend"] == body["backend"]
        seen = [s for b in backends for s in b.seen]
        assert len(seen) == len(JSON_ENDPOINTS) and all(s.body == raw for s in seen)


async def test_backend_keys_file_sends_each_backend_its_own_key(tmp_path: Path) -> None:
    async with echo_backend("e0") as e0, echo_backend("e1") as e1:
        keys = tmp_path / "keys"
        keys.write_text(f"{e0.url} key-zero\ne1 key-one\n")
        specs = (BackendSpec(kind="vllm", url=e0.url, name="e0"), BackendSpec(kind="vllm", url=e1.url, name="e1"))
        async with running_gateway(gateway_settings(backends=specs, backend_keys_file=str(keys))) as gw:
            seen = set()
            for i in range(12):
                _, body, _, _ = await call("POST", gw.url + "/tokenize", body={"model": "m1", "prompt": "x"},
                                           headers={"x-session-id": f"s{i}"})
                seen.add((body["backend"], body["authorization"]))
        assert seen == {("e0", "Bearer key-zero"), ("e1", "Bearer key-one")}


async def test_streamed_completion_is_relayed_unchanged() -> None:
    async with fleet() as (gw, _):
        status, _, headers, payload = await call("POST", gw.url + "/v1/completions?sse=4",
                                                 body={"model": "m1", "prompt": "x", "stream": True})
        assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
        assert payload.count(b"data: ") == 5 and payload.endswith(b"data: [DONE]\n\n")


async def test_backend_errors_are_relayed_as_they_came() -> None:
    async with fleet() as (gw, _):
        status, body, _, _ = await call("POST", gw.url + "/score?status=422", body={"model": "m1"})
        assert status == 422 and body["error"] == {"message": "told to answer 422", "type": "BadRequestError",
                                                   "param": "x", "code": 422}


async def test_routing_by_model_and_without_one() -> None:
    async with fleet((("m1",), ("m2",))) as (gw, _):
        for model, backend in (("m1", "e0"), ("m2", "e1")):
            _, body, _, _ = await call("POST", gw.url + "/tokenize", body={"model": model, "prompt": "x"})
            assert body["backend"] == backend
        status, body, _, _ = await call("POST", gw.url + "/tokenize", body={"prompt": "x"})
        assert status == 400 and body["error"]["param"] == "model"
        # A model no backend lists: a backend answers it (vLLM's own 404, or a LoRA it resolves).
        status, body, _, _ = await call("POST", gw.url + "/tokenize", body={"model": "nope", "prompt": "x"})
        assert status == 200 and body["path"] == "/tokenize"
    async with fleet() as (gw, _):  # one model: a request without one goes to it, as vLLM serves it
        status, body, _, _ = await call("POST", gw.url + "/tokenize", body={"prompt": "x"})
        assert status == 200 and body["bytes"] == len(b'{"prompt":"x"}')


@pytest.mark.parametrize(("raw", "param"), [
    (b"not json", None), (b"[1]", None), (b'{"model": 7}', "model"), (b'{"model": ""}', "model"),
])
async def test_bad_bodies_are_precise_400s(raw: bytes, param: str | None) -> None:
    async with fleet() as (gw, backends):
        for path in ("/v1/completions", "/v1/embeddings", "/score"):
            status, body, _, _ = await call("POST", gw.url + path, raw=raw)
            assert status == 400 and body["error"]["type"] == "invalid_request_error"
            assert body["error"]["param"] == param
        assert not any(b.seen for b in backends)


async def test_unknown_paths_and_methods_are_named() -> None:
    async with fleet() as (gw, _):
        status, body, _, _ = await call("POST", gw.url + "/v1/nothing/here", body={})
        assert status == 404 and "/v1/nothing/here" in body["error"]["message"]
        assert body["error"]["param"] == "path" and body["error"]["code"] == "unknown_endpoint"
        status, body, _, _ = await call("GET", gw.url + "/v1/completions")
        assert status == 405 and "GET /v1/completions" in body["error"]["message"]
        status, body, _, _ = await call("POST", gw.url + "/invocations", body={})
        assert status == 404 and "media policy" in body["error"]["message"]
        metrics = (await call("GET", gw.url + "/metrics"))[3].decode()
        assert 'mmgate_requests_total{route="unmatched",status="404"} 2.0' in metrics


async def test_version_ping_load_and_models_keep_vllm_fields() -> None:
    async with fleet() as (gw, _):
        status, body, _, _ = await call("GET", gw.url + "/version")
        assert status == 200 and body["method"] == "GET" and body["path"] == "/version"
        for method in ("GET", "POST"):
            status, _, _, payload = await call(method, gw.url + "/ping")
            assert status == 200 and payload == b""
        status, body, _, _ = await call("GET", gw.url + "/load")
        assert status == 200 and body == {"server_load": 0}
        status, body, _, _ = await call("GET", gw.url + "/v1/models")
        card = body["data"][0]
        assert card["id"] == "m1" and card["max_model_len"] == 4096 and card["root"] == "/models/m1"
        assert card["permission"][0]["object"] == "model_permission" and "parent" in card


async def test_route_metrics_are_labelled_by_the_route_table() -> None:
    async with fleet() as (gw, _):
        await call("POST", gw.url + "/tokenize", body={"model": "m1", "prompt": "x"})
        await call("POST", gw.url + "/tokenize", body={"model": 3})
        metrics = (await call("GET", gw.url + "/metrics"))[3].decode()
        assert 'mmgate_requests_total{route="/tokenize",status="200"} 1.0' in metrics
        assert 'mmgate_requests_total{route="/tokenize",status="400"} 1.0' in metrics


async def test_tenant_keys_guard_passthrough_endpoints(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("k-alpha alpha\n")
    async with fleet(api_keys_file=str(keys)) as (gw, backends):
        status, body, _, _ = await call("POST", gw.url + "/v1/completions", body={"model": "m1", "prompt": "x"})
        assert status == 401 and not any(b.seen for b in backends)
        status, body, _, _ = await call("POST", gw.url + "/v1/completions", body={"model": "m1", "prompt": "x"},
                                        headers={"Authorization": "Bearer k-alpha"})
        assert status == 200 and body["authorization"] is None
        # /version is open, as on vLLM (its key guards /v1 paths), and outside the tenant limit.
        status, body, _, _ = await call("GET", gw.url + "/version")
        assert status == 200 and body["path"] == "/version"


async def test_a_backend_that_went_away_is_failed_over_and_ejected() -> None:
    async with echo_backend("e0") as e0:
        e1_cm = echo_backend("e1")
        e1 = await e1_cm.__aenter__()
        specs = (BackendSpec(kind="vllm", url=e0.url, name="e0"), BackendSpec(kind="vllm", url=e1.url, name="e1"))
        async with running_gateway(gateway_settings(backends=specs, health_interval_s=60.0)) as gw:
            await e1_cm.__aexit__(None, None, None)  # e1 stops: its port refuses connections
            answers = [await call("POST", gw.url + "/v1/completions", body={"model": "m1", "prompt": "x"},
                                  headers={"x-session-id": f"s{i}"}) for i in range(8)]
            assert all(status == 200 and body["backend"] == "e0" for status, body, _, _ in answers)
            health = (await call("GET", gw.url + "/health"))[1]
            assert [b["healthy"] for b in health["backends"]] == [True, False]


async def test_listing_the_models_does_not_fan_out_per_request() -> None:
    """``/v1/models`` is open without a key: a burst of listings asks each backend for its cards
    once (one round shared by the concurrent ones, kept for ``--health-interval``), not once each."""
    asked = [0]

    async def listing(_request: web.Request) -> web.Response:
        asked[0] += 1
        await asyncio.sleep(0.05)
        return web.json_response({"object": "list", "data": [{"id": "m1", "object": "model", "max_model_len": 7}]})

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/v1/models", listing)
    app.router.add_get("/health", health)
    runner, port = await start_app(app, "127.0.0.1", 0)
    try:
        spec = BackendSpec(kind="vllm", url=f"http://127.0.0.1:{port}", name="b0")
        async with running_gateway(gateway_settings(backends=(spec,), health_interval_s=60.0)) as gw:
            before = asked[0]  # the gateway's own start-up refresh
            answers = await asyncio.gather(*(call("GET", gw.url + "/v1/models") for _ in range(50)))
            assert all(a[0] == 200 and a[1]["data"][0]["max_model_len"] == 7 for a in answers)
            assert asked[0] - before == 1, asked
    finally:
        await runner.cleanup()
