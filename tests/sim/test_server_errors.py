"""Bad input gets vLLM-style 4xx bodies, never a 500; /metrics exposes the counters."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from mmgate.sim.server import SimServer
from tests.sim.conftest import SimFactory
from tests.sim.helpers import chat_body, data_url, image_bytes, image_part, post_chat


async def test_unknown_model_is_404(http: aiohttp.ClientSession, sim: SimServer) -> None:
    body = chat_body()
    body["model"] = "gpt-x"
    status, out = await post_chat(http, sim, body)
    assert status == 404
    assert out == {"error": {"message": "The model `gpt-x` does not exist. Valid aliases: mmgate-sim-vl.",
                             "type": "NotFoundError", "param": "model", "code": 404}}


async def test_malformed_json_is_400(http: aiohttp.ClientSession, sim: SimServer) -> None:
    for raw in (b"{not json", b"", b"[1, 2]", b'"text"'):
        async with http.post(f"{sim.url}/v1/chat/completions", data=raw,
                             headers={"Content-Type": "application/json"}) as resp:
            out = await resp.json()
            assert resp.status == 400, raw
            assert out["error"]["type"] == "BadRequestError" and out["error"]["code"] == 400


@pytest.mark.parametrize(
    "body",
    [
        {"model": "mmgate-sim-vl"},
        {"messages": []},
        {"messages": "hi"},
        {"messages": [{"role": "wizard", "content": "hi"}]},
        {"messages": [{"role": "user", "content": 5}]},
        {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": ""}}]}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": None, "uuid": 7}]}]},
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0},
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"},
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "min_tokens": 6},
        {"messages": [{"role": "user", "content": "hi"}], "n": 0},
        {"messages": [{"role": "user", "content": "hi"}], "stream_options": {"include_usage": True}},
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10_000_000},
    ],
)
async def test_invalid_requests_are_400(http: aiohttp.ClientSession, sim: SimServer, body: Any) -> None:
    status, out = await post_chat(http, sim, body)
    assert status == 400, out
    assert out["error"]["type"] == "BadRequestError" and out["error"]["message"]


async def test_undecodable_image_is_400(http: aiohttp.ClientSession, sim: SimServer) -> None:
    for url in (data_url(b"this is not an image"), "data:image/png;base64,!!!notbase64",
                data_url(image_bytes(64, 64)[:50])):
        status, out = await post_chat(http, sim, chat_body(image_part(url, uuid="bad")))
        assert status == 400, url
        assert "image" in out["error"]["message"].lower()
    assert len(sim.engine.cache) == 0  # nothing poisoned
    status, _ = await post_chat(http, sim, chat_body(image_part(uuid="bad")))
    assert status == 400


async def test_limits(http: aiohttp.ClientSession, make_sim: SimFactory) -> None:
    sim = await make_sim(max_images_per_request=2, max_image_bytes=100)
    img = data_url(image_bytes(seed=1))
    status, out = await post_chat(http, sim, chat_body(*[image_part(uuid=f"u{i}") for i in range(3)]))
    assert status == 400 and "At most 2 image(s)" in out["error"]["message"]
    status, out = await post_chat(http, sim, chat_body(image_part(img)))
    assert len(image_bytes(seed=1)) > 100
    assert status == 400 and "exceeds the limit" in out["error"]["message"]


async def test_oversized_body_is_413(http: aiohttp.ClientSession, make_sim: SimFactory) -> None:
    sim = await make_sim(max_body_bytes=4096)
    status, out = await post_chat(http, sim, chat_body(text="x" * 10_000))
    assert status == 413 and out["error"]["code"] == 413
    status, _ = await post_chat(http, sim, chat_body(text="x" * 100))
    assert status == 200


async def test_metrics_expose_vllm_and_sim_counters(http: aiohttp.ClientSession, sim: SimServer) -> None:
    img = data_url(image_bytes(seed=9))
    await post_chat(http, sim, chat_body(image_part(img, uuid="m1"), max_tokens=3))
    await post_chat(http, sim, chat_body(image_part(uuid="m1"), max_tokens=3))
    await post_chat(http, sim, chat_body(image_part(uuid="m2")))
    async with http.get(f"{sim.url}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    labels = '{engine="0",model_name="mmgate-sim-vl"}'
    expected = [
        f"vllm:mm_cache_queries_total{labels} 2.0",  # the failed request (m2 unknown) counts none
        f"vllm:mm_cache_hits_total{labels} 1.0",
        f"vllm:generation_tokens_total{labels} 6.0",
        "mmgate_sim_images_processed_total 1.0",
        f"mmgate_sim_image_bytes_received_total {float(len(image_bytes(seed=9)))}",
        'mmgate_sim_requests_total{status="200"} 2.0',
        'mmgate_sim_requests_total{status="400"} 1.0',
        f"vllm:num_requests_running{labels} 0.0",
        f"vllm:num_requests_waiting{labels} 0.0",  # vLLM's two scheduler gauges, as it spells them
    ]
    for line in expected:
        assert line in text, line
    assert f"vllm:prompt_tokens_total{labels}" in text


async def test_two_engines_in_one_process_have_separate_state(
    http: aiohttp.ClientSession, make_sim: SimFactory
) -> None:
    a, b = await make_sim(), await make_sim(model="other")
    await post_chat(http, a, chat_body(image_part(data_url(image_bytes(seed=3)), uuid="x")))
    assert a.stats.cache_queries == 1 and b.stats.cache_queries == 0
    body = chat_body(image_part(uuid="x"))
    body["model"] = "other"
    status, _ = await post_chat(http, b, body)
    assert status == 400
    async with http.get(f"{b.url}/metrics") as resp:
        assert 'vllm:mm_cache_hits_total{engine="0",model_name="other"} 0.0' in await resp.text()
