"""The gateway end to end on loopback: real gateway, real sim engines (vLLM stand-ins: vLLM itself
cannot run here), the OpenAI SDK and raw aiohttp as clients."""

from __future__ import annotations

import base64
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI, BadRequestError, NotFoundError

from tests.support.gateway import gateway_settings, running_gateway, running_sims, vllm_specs
from tests.support.http import post
from tests.support.images import png_data_url
from tests.support.recorder import recording_proxy

MODEL = "mmgate-sim-vl"


def user(*parts: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "text", "text": "describe"}, *parts]}]


def image(url: str | None, uuid: str | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "image_url", "image_url": {"url": url} if url else None}
    if uuid is not None:
        part["uuid"] = uuid
    return part


async def test_uuid_then_cache_only_reference_hits_the_same_engine() -> None:
    async with running_sims(2) as sims, running_gateway(gateway_settings(backends=vllm_specs(sims))) as gw:
        client = AsyncOpenAI(base_url=gw.url + "/v1", api_key="x", default_headers={"x-session-id": "s1"})
        first = await client.chat.completions.create(
            model=MODEL, messages=user(image(png_data_url(1), "cat-1"))  # type: ignore[arg-type]
        )
        assert first.choices[0].message.content
        second = await client.chat.completions.create(
            model=MODEL, messages=user(image(None, "cat-1"))  # type: ignore[arg-type]
        )
        assert second.choices[0].message.content
        assert sum(s.stats.cache_hits for s in sims) == 1
        assert sum(s.stats.images_processed for s in sims) == 1
        await client.close()


async def test_streaming_cache_only_reference_and_sse_frames() -> None:
    async with running_gateway() as gw:
        client = AsyncOpenAI(base_url=gw.url + "/v1", api_key="x", default_headers={"x-session-id": "s2"})
        await client.chat.completions.create(model=MODEL, messages=user(image(png_data_url(2), "u2")))  # type: ignore[arg-type]
        stream = await client.chat.completions.create(
            model=MODEL, stream=True, stream_options={"include_usage": True},
            messages=user(image(None, "u2")),  # type: ignore[arg-type]
        )
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage:
                usage = chunk.usage
        assert text and usage is not None and usage.completion_tokens > 0
        await client.close()


async def test_no_uuid_gets_a_content_uuid_and_extra_fields_are_forwarded() -> None:
    async with running_sims(1) as sims, recording_proxy(sims[0].url) as rec:
        settings = gateway_settings(backends=vllm_specs([rec]))
        async with running_gateway(settings) as gw:
            url = png_data_url(3)
            body = {"model": MODEL, "messages": user(image(url)), "top_k": 3, "mm_processor_kwargs": {}}
            status, _, _ = await post(gw.url, body)
            assert status == 200
            sent = rec.bodies[-1]
            assert sent["top_k"] == 3 and sent["mm_processor_kwargs"] == {}
            part = rec.image_parts()[0]
            assert part["uuid"].startswith("~sha256:") and len(part["uuid"]) == 8 + 64
            assert part["image_url"]["url"].startswith("data:image/png;base64,")
            # A client uuid can never name a content key: the key as a client uuid is another key
            # (no entry anywhere: 400), so nobody can read or overwrite an unlabelled image by it.
            status, err, _ = await post(gw.url, {"model": MODEL, "messages": user(image(None, part["uuid"]))})
            assert status == 400 and err["error"]["code"] == "unknown_image_uuid"
            assert rec.image_parts()[0] == {"type": "image_url", "image_url": None, "uuid": "~" + part["uuid"]}


async def test_openai_kind_never_sees_a_uuid_and_gets_cache_only_refs_resolved() -> None:
    async with running_sims(1) as sims, recording_proxy(sims[0].url) as rec:
        from mmgate.config import BackendSpec

        settings = gateway_settings(backends=(BackendSpec(kind="openai", url=rec.url, name="plain"),))
        async with running_gateway(settings) as gw:
            status, _, _ = await post(gw.url, {"model": MODEL, "messages": user(image(png_data_url(4), "u4"))})
            assert status == 200
            assert "uuid" not in rec.image_parts()[0]
            sent_first = rec.image_parts()[0]["image_url"]["url"]
            # A cache-only reference is resolved from the gateway's UUID store: the bytes go again.
            status, _, _ = await post(gw.url, {"model": MODEL, "messages": user(image(None, "u4"))})
            assert status == 200
            assert rec.image_parts()[0] == {"type": "image_url", "image_url": {"url": sent_first}}
            status, err, _ = await post(gw.url, {"model": MODEL, "messages": user(image(None, "nope"))})
            assert status == 400
            assert err["error"]["param"] == "messages[0].content[1]" and "nope" in err["error"]["message"]
            assert len(rec.bodies) == 2


async def test_cache_only_miss_is_a_400_naming_the_uuid() -> None:
    async with running_gateway() as gw:
        client = AsyncOpenAI(base_url=gw.url + "/v1", api_key="x")
        with pytest.raises(BadRequestError) as info:
            await client.chat.completions.create(
                model=MODEL, messages=user(image(png_data_url(5), "known"), image(None, "never-sent"))  # type: ignore[arg-type]
            )
        error = info.value.body
        assert isinstance(error, dict)
        assert "never-sent" in error["message"]
        assert error["param"] == "messages[0].content[2]"
        await client.close()


@pytest.mark.parametrize(
    ("messages", "status", "param"),
    [
        (user({"type": "image_url", "image_url": None}), 400, "messages[0].content[1]"),
        (user({"type": "image_url", "image_url": None, "uuid": ""}), 400, "messages[0].content[1]"),
        (user({"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}, "uuid": "a"}), 400,
         "messages[0].content[1]"),
        (user(image("data:image/png;base64,!!!!", "bad")), 400, "messages[0].content[1]"),
        (user(image("data:image/png;base64," + base64.b64encode(b"not an image at all").decode())), 400,
         "messages[0].content[1]"),
        (user(image("http://127.0.0.2/x.png")), 400, "messages[0].content[1]"),
        (user(image("http://169.254.169.254/latest/meta-data/")), 400, "messages[0].content[1]"),
    ],
)
async def test_rejections_are_openai_errors_naming_the_part(
    messages: list[dict[str, Any]], status: int, param: str
) -> None:
    async with running_gateway() as gw:
        got, body, _ = await post(gw.url, {"model": MODEL, "messages": messages})
        assert got == status, body
        assert body["error"]["param"] == param
        assert body["error"]["type"] == "invalid_request_error"
        assert body["error"]["message"]


async def test_malformed_json_unknown_model_and_too_many_images() -> None:
    async with running_gateway(gateway_settings(max_images_per_request=2)) as gw, aiohttp.ClientSession() as s:
        async with s.post(gw.url + "/v1/chat/completions", data=b"{nope", headers={"Content-Type": "application/json"}) as r:
            assert r.status == 400
            assert "not valid JSON" in (await r.json())["error"]["message"]
        client = AsyncOpenAI(base_url=gw.url + "/v1", api_key="x")
        with pytest.raises(NotFoundError):
            await client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
        await client.close()
        three = user(*(image(png_data_url(i)) for i in range(3)))
        status, body, _ = await post(gw.url, {"model": MODEL, "messages": three})
        assert status == 400 and body["error"]["param"] == "messages[0].content[3]"


async def test_models_health_and_metrics() -> None:
    async with running_gateway() as gw, aiohttp.ClientSession() as s:
        async with s.get(gw.url + "/v1/models") as r:
            assert [m["id"] for m in (await r.json())["data"]] == [MODEL]
        async with s.get(gw.url + "/health") as r:
            assert r.status == 200
        await post(gw.url, {"model": MODEL, "messages": user(image(png_data_url(9), "m9"))})
        async with s.get(gw.url + "/metrics") as r:
            text = await r.text()
        assert 'mmgate_requests_total{route="/v1/chat/completions",status="200"} 1.0' in text
        assert 'mmgate_images_forwarded_total{mode="data"} 1.0' in text


async def test_a_request_without_model_goes_to_the_fleets_one_model() -> None:
    """As vLLM fills in its served model: the gateway fills in the one model its backends serve."""
    async with running_gateway() as gw:
        async with aiohttp.ClientSession() as s:
            async with s.post(gw.url + "/v1/chat/completions",
                              json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}) as r:
                body = await r.json()
                assert r.status == 200, body
                assert body["model"] == "mmgate-sim-vl"
