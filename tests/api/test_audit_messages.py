"""``/v1/messages`` under attack, through a real gateway: a backend stream cut short ends with an
Anthropic ``error`` event, requests forwarded to the backend's own endpoint (thinking, inline
system messages, count_tokens) get the tenant's prefix-cache salt, its image key space and the
request's pixel limit as mapped ones do, and a refusal of any kind is in Anthropic's error shape.
Real gateway, real sim engines, echo backends (``tests.backends.echo_server``), a real image origin
and a scripted chat backend (an aiohttp server on loopback)."""

from __future__ import annotations

import asyncio
import base64
import io
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import orjson
import pytest
from aiohttp import web
from PIL import Image

from mmgate.config import BackendSpec
from mmgate.sim.config import SimSettings
from tests.api.test_endpoints import call as raw_call
from tests.api.test_endpoints import fleet
from tests.support.agents import call, is_anthropic_error
from tests.support.apps import serving, vllm_like
from tests.support.gateway import gateway_settings, running_gateway
from tests.support.images import make_image
from tests.support.origin import ImageOrigin
from tests.support.serve_process import metric_value, serve_process

MODEL = "m1"
A = {"Authorization": "Bearer key-a"}
B = {"Authorization": "Bearer key-b"}


RESET = b"<reset>"  # a tail that resets the connection instead of ending the response


def sse(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


@asynccontextmanager
async def cutting_backend(tail: bytes) -> AsyncIterator[str]:
    """A backend whose streams (chat completions, and its own /v1/messages) send their first events,
    then ``tail``, then end the response (or reset the connection: ``RESET``)."""
    chunks = [{"id": "c", "model": MODEL, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
              {"id": "c", "model": MODEL, "choices": [{"index": 0, "delta": {"content": "hello"}}]}]
    start = {"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant", "content": [],
                                                  "model": MODEL, "usage": {"input_tokens": 1, "output_tokens": 0}}}
    block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "event: message_stop"}}
    frames = {"/v1/chat/completions": [b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks],
              "/v1/messages": [sse("message_start", start), sse("content_block_start", block),
                               sse("content_block_delta", delta)]}

    async def stream(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for frame in frames[request.path]:
            await response.write(frame)
        if tail == RESET:
            await asyncio.sleep(0.05)  # the frames leave first
            assert request.transport is not None
            request.transport.abort()
            return response
        await response.write(tail)
        await response.write_eof()
        return response

    async with serving(vllm_like(MODEL, dict.fromkeys(frames, stream))) as url:
        yield url


CUTS = {"mid-event": b'data: {"id":"c","model":"m1","choi', "no-end": b"", "reset": RESET}
MAPPED = {"model": MODEL, "max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
FORWARDED = {**MAPPED, "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("cut", list(CUTS))
@pytest.mark.parametrize("body", [MAPPED, FORWARDED], ids=["mapped", "forwarded"])
async def test_a_stream_the_backend_ends_early_ends_with_an_error_event(cut: str, body: dict[str, Any]) -> None:
    async with cutting_backend(CUTS[cut]) as url, running_gateway(gateway_settings(
            backends=(BackendSpec(kind="vllm", url=url, name="cut"),))) as gw:
        reply = await call(gw.url, "/v1/messages", body)
        names = [name for name, _ in reply.events]
        assert reply.status == 200 and names[0] == "message_start" and "content_block_delta" in names
        # Not a stream that just stops, nor an error in another API's shape: the SDK sees why.
        assert names[-1] == "error", names
        error = reply.events[-1][1]
        assert error["type"] == "error" and isinstance(error["error"]["type"], str), error
        assert "backend" in error["error"]["message"], error
        assert "message_stop" not in names



def keys_file(tmp_path: Path) -> str:
    path = tmp_path / "keys.txt"
    path.write_text("key-a tenant-a\nkey-b tenant-b\n")
    return str(path)


def forwarded(*blocks: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A request the gateway forwards to the backend's own /v1/messages (inline system message)."""
    return {"model": MODEL, "max_tokens": 4, **extra,
            "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [
                {"type": "text", "text": "look"}, *blocks]}]}


def url_image(url: str) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "url", "url": url}}


async def test_forwarded_requests_get_the_tenants_cache_salt(tmp_path: Path) -> None:
    async with fleet(models=((MODEL,),), api_keys_file=keys_file(tmp_path)) as (gw, (echo,)):
        salts = []
        for who in (A, B):
            for extra in ({}, {"cache_salt": "mine"}):
                for body in (forwarded(**extra), {**forwarded(**extra), "thinking": {"type": "disabled"}}):
                    status, answer, _, _ = await raw_call("POST", gw.url + "/v1/messages", body=body, headers=who)
                    assert status == 200, answer
                    assert echo.seen[-1].path_qs == "/v1/messages"
                    salts.append(orjson.loads(echo.seen[-1].body).get("cache_salt"))
        # Per tenant, per client salt: never absent, never the client's own, never another tenant's.
        assert None not in salts and "mine" not in salts
        assert len(set(salts)) == 4 and salts[0] == salts[1] and salts[2] == salts[3]


async def test_forwarded_images_load_in_the_tenants_key_space(tmp_path: Path, origin: ImageOrigin) -> None:
    url = origin.add("a.png", make_image("PNG", seed=3))
    async with fleet(models=((MODEL,),), api_keys_file=keys_file(tmp_path)) as (gw, (echo,)):
        sent = []
        for who in (A, A, B):
            status, answer, _, _ = await raw_call("POST", gw.url + "/v1/messages", body=forwarded(url_image(url)),
                                                  headers=who)
            assert status == 200, answer
            source = orjson.loads(echo.seen[-1].body)["messages"][1]["content"][1]["source"]
            assert source["type"] == "base64" and source["media_type"] == "image/png"
            sent.append(base64.b64decode(source["data"]))
        # vLLM keys such an image by its bytes: each tenant's carry its own mark, the same pixels.
        assert sent[0] == sent[1] != sent[2] and all(len(b) > len(make_image("PNG", seed=3)) for b in sent)
        pixels = {Image.open(io.BytesIO(b)).convert("RGB").tobytes() for b in sent}
        assert pixels == {Image.open(io.BytesIO(make_image("PNG", seed=3))).convert("RGB").tobytes()}
        # A's repeat is A's cache hit; B's request does not see A's image (nor learn it was loaded).
        assert origin.hits["/img/a.png"] == 2
        status, answer, _, _ = await raw_call("POST", gw.url + "/v1/messages/count_tokens", headers=B, body={
            "model": MODEL, "messages": [{"role": "user", "content": [url_image(url)]}]})
        assert status == 200 and origin.hits["/img/a.png"] == 2  # B's own, held since its first load


async def test_forwarded_images_count_against_the_request_pixel_limit(origin: ImageOrigin) -> None:
    urls = [origin.add(f"{i}.png", make_image("PNG", seed=i)) for i in range(2)]  # 64x48 each
    limit = {"max_request_pixels": 64 * 48 * 3 // 2}
    async with fleet(models=((MODEL,),), media={"allowed_private": ("127.0.0.1",), **limit}) as (gw, (echo,)):
        for path, body in (("/v1/messages", forwarded(*map(url_image, urls))),
                           ("/v1/messages/count_tokens", {"model": MODEL, "messages": [
                               {"role": "user", "content": [url_image(u) for u in urls]}]})):
            status, answer, _, _ = await raw_call("POST", gw.url + path, body=body)
            assert status == 400 and answer["type"] == "error", (path, answer)
            assert "--max-request-pixels" in answer["error"]["message"]
            assert "(param: messages[" in answer["error"]["message"]
        # Refused before the request reached the backend (which only answered the gateway's probe of
        # its chat template: mmgate.api.anthropic.template_probes).
        assert not [s for s in echo.seen if s.path_qs in ("/v1/messages", "/v1/chat/completions")]


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
async def test_a_wrong_method_is_an_anthropic_error(method: str) -> None:
    async with running_gateway() as gw:
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            reply = await call(gw.url, path, method=method)
            assert reply.status == 405 and is_anthropic_error(reply), (path, reply.json)
            assert method in reply.json["error"]["message"]


TOOL_CHANGE = {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "f"}}


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}, TOOL_CHANGE]}]},
     "messages[0].content[1].type"),
    ({"messages": [{"role": "assistant", "content": [{**TOOL_CHANGE, "type": "tool_removal"}]}]},
     "messages[0].content[0].type"),
    ({"system": [TOOL_CHANGE], "messages": [{"role": "user", "content": "x"}]}, "system[0].type"),
])
async def test_tool_changes_outside_a_system_message_are_refused(body: dict[str, Any], param: str) -> None:
    """vLLM refuses them there (400); the mapping dropped them and served the request."""
    async with running_gateway() as gw:
        reply = await call(gw.url, "/v1/messages", {"model": "mmgate-sim-vl", "max_tokens": 4, **body})
        assert reply.status == 400 and is_anthropic_error(reply), reply.json
        assert f"(param: {param})" in reply.json["error"]["message"]


# The guard (mmgate.api.app._guard) answers what it refuses before the handler runs: on the
# Messages paths in Anthropic's shape (it answered in OpenAI's).
async def test_the_tenant_limits_refusals_are_anthropic_errors(tmp_path: Path) -> None:
    """With API keys the guard authenticates and counts a request before its handler runs: its 401
    and 429 on /v1/messages are in Anthropic's shape too."""
    slow = SimSettings(port=0, speedup=1.0, decode_ms_per_token=50.0)
    settings = gateway_settings(api_keys_file=keys_file(tmp_path), max_tenant_requests=1)
    body = {"model": "mmgate-sim-vl", "max_tokens": 40, "stream": True, "messages": [{"role": "user", "content": "go"}]}
    async with running_gateway(settings, sim=slow) as gw:
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            for headers in ({}, {"Authorization": "Bearer nope"}):
                reply = await call(gw.url, path, body, headers=headers)
                assert reply.status == 401 and is_anthropic_error(reply), reply.json
                assert reply.json["error"]["type"] == "authentication_error"
        async with aiohttp.ClientSession() as s, s.post(gw.url + "/v1/messages", json=body, headers=A) as held:
            assert held.status == 200
            reply = await call(gw.url, "/v1/messages", body, headers=A)
            assert reply.status == 429 and is_anthropic_error(reply), reply.json
            assert reply.json["error"]["type"] == "rate_limit_error" and reply.headers["retry-after"] == "1"


async def test_an_anthropic_client_is_its_tenant_by_its_x_api_key(tmp_path: Path) -> None:
    """Anthropic's API takes its key as ``x-api-key`` (its reference's curl lines, its SDKs before
    2.x): the gateway takes it for the key's tenant as it takes ``Authorization: Bearer`` (which
    today's SDK sends), a wrong one a 401 in Anthropic's shape; each request counted under its tenant."""
    admin = tmp_path / "admin.key"
    admin.write_text("admin-secret-0123456789")
    settings = gateway_settings(api_keys_file=keys_file(tmp_path), admin_key_file=str(admin))
    hello = [{"role": "user", "content": "hi"}]
    body = {"model": "mmgate-sim-vl", "max_tokens": 4, "messages": hello}
    async with running_gateway(settings) as gw:
        async with anthropic.AsyncAnthropic(base_url=gw.url, api_key="key-b", max_retries=0, timeout=30) as sdk:
            message = await sdk.messages.create(model="mmgate-sim-vl", max_tokens=4, messages=hello)
            assert message.role == "assistant" and message.usage.output_tokens > 0
        version = {"anthropic-version": "2023-06-01"}
        reply = await call(gw.url, "/v1/messages", body, headers={**version, "x-api-key": "key-a"})
        assert reply.status == 200 and reply.json["type"] == "message", reply.json
        for key in ("nope", "key-ab", ""):
            reply = await call(gw.url, "/v1/messages", body, headers={**version, "x-api-key": key})
            assert reply.status == 401 and is_anthropic_error(reply), reply.json
            assert reply.json["error"]["type"] == "authentication_error"
        scraper = {"Authorization": "Bearer admin-secret-0123456789"}
        async with aiohttp.ClientSession() as s, s.get(gw.url + "/metrics", headers=scraper) as scrape:
            text = await scrape.text()
        for tenant in ("tenant-a", "tenant-b"):
            assert metric_value(text, "mmgate_tenant_requests_total", tenant=tenant, status_class="2xx") == 1


# A host that is no DNS name (a label over 63 characters, an empty one) made getaddrinfo's IDNA
# encoding raise UnicodeError in mmgate.media.dns.PolicyResolver: aiohttp's plain 500. The URL policy
# refuses such a host now (400), before any tier or lookup.
@pytest.mark.parametrize("host", ["a" * 64 + ".example", "a..example", ".a.example"])
async def test_an_image_host_that_is_no_dns_name_is_a_400(host: str) -> None:
    url = f"http://{host}/x.png"
    async with running_gateway() as gw:
        status, answer, _, raw = await raw_call("POST", gw.url + "/v1/messages", body={
            "model": "mmgate-sim-vl", "max_tokens": 4, "messages": [{"role": "user", "content": [url_image(url)]}]})
        assert status == 400 and answer["type"] == "error", raw[:200]
        status, _, _, raw = await raw_call("POST", gw.url + "/v1/chat/completions", body={
            "model": "mmgate-sim-vl",
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]})
        assert status == 400, raw[:200]


async def test_a_body_of_many_small_blocks_leaves_the_gateway_serving(tmp_path: Path) -> None:
    """Checking and mapping 120,000 blocks (under ``jsonbody.MAX_CONTAINERS``) is pure Python for
    most of a second: it runs in a thread, so that the gateway (a real ``mmgate serve``) answers
    others meanwhile. The refusal at the end (a private image URL) keeps the engine out of the timing."""
    blocks = [{"type": "text", "text": "x"}] * 120_000 + [url_image("http://10.0.0.1/x.png")]
    raw = orjson.dumps({"model": "mmgate-sim-vl", "max_tokens": 1, "messages": [{"role": "user", "content": blocks}]})
    with serve_process(tmp_path) as gw:
        async with aiohttp.ClientSession() as s:
            worst = 0.0
            done = asyncio.Event()

            async def ping() -> None:
                nonlocal worst
                while not done.is_set():
                    started = time.monotonic()
                    async with s.get(gw.url + "/ping") as r:
                        assert r.status == 200
                    worst = max(worst, time.monotonic() - started)
                    await asyncio.sleep(0.01)

            pinger = asyncio.create_task(ping())
            await asyncio.sleep(0.1)
            started = time.monotonic()
            async with s.post(gw.url + "/v1/messages", data=raw, headers={"Content-Type": "application/json"}) as r:
                answer = await r.json()
            took = time.monotonic() - started
            done.set()
            await pinger
        assert r.status == 400 and "10.0.0.1" in answer["error"]["message"], answer
        assert worst < took / 3, (worst, took)  # on the loop, a ping waited for the whole walk


@asynccontextmanager
async def erring_backend() -> AsyncIterator[str]:
    """A backend whose /v1/messages refuses as vLLM's request validation does (OpenAI's shape:
    FastAPI's handler, not the Anthropic router's) and which does not serve count_tokens."""
    async def messages(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"error": {"message": "1 validation error: thinking.budget_tokens >= 1024",
                                             "type": "Bad Request", "param": None, "code": 400}}, status=400)

    async with serving(vllm_like(MODEL, {"/v1/messages": messages})) as url:
        yield url


async def test_a_forwarded_refusal_reaches_the_client_in_anthropics_shape() -> None:
    async with erring_backend() as url, running_gateway(gateway_settings(
            backends=(BackendSpec(kind="vllm", url=url, name="err"),))) as gw:
        reply = await call(gw.url, "/v1/messages", {**FORWARDED, "thinking": {"type": "enabled", "budget_tokens": 1}})
        assert reply.status == 400 and is_anthropic_error(reply), reply.raw
        assert reply.json["error"]["message"].startswith("1 validation error")
        status, answer, _, raw = await raw_call("POST", gw.url + "/v1/messages/count_tokens",
                                                body={"model": MODEL, "messages": []})
        assert status == 404 and answer is not None and answer["type"] == "error", raw
        assert answer["error"]["type"] == "not_found_error"


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/messages", {"messages": [{"role": {}, "content": "x"}]}, "messages[0].role"),
    ("/v1/messages/count_tokens", {"messages": [{"role": ["user"], "content": "x"}]}, "messages[0].role"),
    ("/v1/messages", {"messages": [{"role": "user", "content": [{"type": ["text"]}]}]}, "messages[0].content[0].type"),
    ("/v1/messages", {"system": [{"type": {"a": 1}}], "messages": []}, "system[0].type"),
    ("/v1/messages", {"tool_choice": {"type": []}, "messages": []}, "tool_choice.type"),
    ("/v1/messages", {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "text", "text": 5}]}]}]}, "messages[0].content[0].content[0].text"),
    ("/v1/messages", {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": None}]}]}]}, "messages[0].content[0].content[1].text"),
])
async def test_a_field_of_the_wrong_type_is_a_400_not_a_500(path: str, body: dict[str, Any], param: str) -> None:
    """A list or an object where a name is expected was looked up in a set (unhashable: 500), and a
    tool result's text item that is not a string was joined (500, as on vLLM)."""
    async with running_gateway() as gw:
        status, answer, _, raw = await raw_call("POST", gw.url + path, body={
            "model": "mmgate-sim-vl", "max_tokens": 4, **body})
        assert status == 400 and answer is not None and answer["type"] == "error", raw[:200]
        assert f"(param: {param})" in answer["error"]["message"], answer


@pytest.mark.parametrize("field", ["kv_transfer_params", "ec_transfer_params"])
async def test_a_forwarded_request_does_not_carry_transfer_params(field: str) -> None:
    """A request forwarded to the backend's own /v1/messages (here: thinking) skips the chat
    pipeline that refuses them (api.police.refuse_transfer_params): refused there too."""
    params = {"do_remote_prefill": True, "remote_host": "10.0.0.7", "remote_port": 5600}
    async with fleet(models=((MODEL,),)) as (gw, (echo,)):
        body = {**forwarded(), "thinking": {"type": "adaptive"}, field: params}
        reply = await call(gw.url, "/v1/messages", body)
        assert reply.status == 400 and is_anthropic_error(reply), reply.raw
        assert f"(param: {field})" in reply.json["error"]["message"]
        assert not echo.seen
    async with fleet(models=((MODEL,),), allow_transfer_params=True) as (gw, (echo,)):
        reply = await call(gw.url, "/v1/messages", body)
        assert reply.status == 200 and orjson.loads(echo.seen[-1].body)[field] == params


async def test_a_messages_path_the_gateway_does_not_serve_is_an_anthropic_404() -> None:
    """The Anthropic SDK's other /v1/messages/... calls (batches) get its error shape; the operator
    endpoint under the same prefix is still the operator's."""
    async with running_gateway() as gw:
        for method, path in (("POST", "/v1/messages/batches"), ("GET", "/v1/messages/batches/msgbatch_1/results"),
                             ("POST", "/v1/messages/"),
                             ("DELETE", "/v1/messages/batches/msgbatch_1")):
            reply = await call(gw.url, path, {} if method == "POST" else None, method=method)
            assert reply.status == 404 and is_anthropic_error(reply), (path, reply.raw)
            assert reply.json["error"]["type"] == "not_found_error" and path in reply.json["error"]["message"]
        status, answer, _, raw = await raw_call("POST", gw.url + "/v1/messages/render", body={})
        assert status == 403 and answer["error"]["code"] == "admin_key_required", raw
