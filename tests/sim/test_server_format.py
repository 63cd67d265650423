"""OpenAI wire format of the sim, seen by the openai SDK and by raw aiohttp."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest
from openai import AsyncOpenAI

from mmgate.sim.server import SimServer
from tests.sim.helpers import chat_body, data_url, image_bytes, image_part, post_chat
from tests.support.agents import call
from tests.support.gateway import running_gateway


@pytest.fixture
async def client(sim: SimServer) -> Any:
    async with AsyncOpenAI(base_url=f"{sim.url}/v1", api_key="x", max_retries=0, timeout=30) as c:
        yield c


async def test_sdk_non_streaming_with_image(client: AsyncOpenAI, sim: SimServer) -> None:
    messages: Any = chat_body(image_part(data_url(image_bytes(512, 300)), uuid="u1"),
                              text="abcdefgh")["messages"]
    out = await client.chat.completions.create(model="mmgate-sim-vl", messages=messages, max_tokens=5)
    assert out.object == "chat.completion"
    assert out.model == "mmgate-sim-vl"
    assert out.id.startswith("chatcmpl-")
    choice = out.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason == "length"
    assert len(choice.message.content or "") > 0
    assert out.usage is not None
    # 8 chars = 2 tokens, + 3 per message + 3 assistant prime; 512x300 → 504x308 → 18*11 image tokens
    # between <|vision_start|> and <|vision_end|>.
    assert out.usage.prompt_tokens == 2 + 3 + 3 + 18 * 11 + 2
    assert out.usage.completion_tokens == 5
    assert out.usage.total_tokens == out.usage.prompt_tokens + 5
    assert sim.stats.prompt_tokens == out.usage.prompt_tokens


async def test_sdk_streaming_with_usage(client: AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model="mmgate-sim-vl", messages=[{"role": "user", "content": "Hello there"}],
        max_tokens=7, stream=True, stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) == 7
    assert content[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in content[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 7
    assert last.usage.prompt_tokens == 3 + 3 + 3
    assert {c.id for c in chunks} == {chunks[0].id}


async def _sse_frames(http: aiohttp.ClientSession, sim: SimServer, body: Any) -> tuple[str, list[bytes]]:
    async with http.post(f"{sim.url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        raw = await resp.read()
        return resp.headers["Content-Type"], [f for f in raw.split(b"\n\n") if f]


async def test_raw_sse_frame_order(http: aiohttp.ClientSession, sim: SimServer) -> None:
    body = chat_body(max_tokens=3, stream=True, stream_options={"include_usage": True})
    ctype, frames = await _sse_frames(http, sim, body)
    assert ctype.startswith("text/event-stream")
    assert all(f.startswith(b"data: ") for f in frames)
    assert frames[-1] == b"data: [DONE]"
    chunks = [orjson.loads(f[6:]) for f in frames[:-1]]
    assert [c["object"] for c in chunks] == ["chat.completion.chunk"] * 5
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [c["choices"][0]["delta"]["content"] for c in chunks[1:4]]
    assert [c["choices"][0]["finish_reason"] for c in chunks[1:4]] == [None, None, "length"]
    assert chunks[4]["choices"] == []
    assert chunks[4]["usage"]["completion_tokens"] == 3
    assert all("usage" not in c for c in chunks[:4])
    # The same prompt non-streamed gives the same text.
    status, whole = await post_chat(http, sim, chat_body(max_tokens=3))
    assert status == 200 and whole["choices"][0]["message"]["content"] == "".join(deltas)


async def test_stream_without_usage_and_continuous_usage(http: aiohttp.ClientSession, sim: SimServer) -> None:
    _, frames = await _sse_frames(http, sim, chat_body(max_tokens=2, stream=True))
    chunks = [orjson.loads(f[6:]) for f in frames[:-1]]
    assert len(chunks) == 3 and all("usage" not in c for c in chunks)
    body = chat_body(max_tokens=2, stream=True,
                     stream_options={"include_usage": True, "continuous_usage_stats": True})
    _, frames = await _sse_frames(http, sim, body)
    chunks = [orjson.loads(f[6:]) for f in frames[:-1]]
    assert [c["usage"]["completion_tokens"] for c in chunks] == [0, 1, 2, 2]


async def test_max_tokens_and_determinism(http: aiohttp.ClientSession, sim: SimServer) -> None:
    texts = []
    for key in ("max_tokens", "max_completion_tokens"):
        status, out = await post_chat(http, sim, chat_body(text="same prompt", **{key: 40}, ignore_eos=True))
        assert status == 200
        assert out["usage"]["completion_tokens"] == 40
        assert out["choices"][0]["finish_reason"] == "length"
        texts.append(out["choices"][0]["message"]["content"])
    assert texts[0] == texts[1] and len(texts[0].split()) == 40
    _, other = await post_chat(http, sim, chat_body(text="another prompt", max_tokens=40, ignore_eos=True))
    assert other["choices"][0]["message"]["content"] != texts[0]
    _, default = await post_chat(http, sim, chat_body(text="same prompt"))
    assert default["usage"]["completion_tokens"] == 16  # default_max_tokens


async def test_natural_stop_and_min_tokens(http: aiohttp.ClientSession, sim: SimServer) -> None:
    status, out = await post_chat(http, sim, chat_body(max_tokens=1000))
    n = out["usage"]["completion_tokens"]
    assert status == 200 and out["choices"][0]["finish_reason"] == "stop" and 8 <= n < 1000
    _, longer = await post_chat(http, sim, chat_body(max_tokens=1000, min_tokens=n + 5))
    assert longer["usage"]["completion_tokens"] == n + 5


async def test_models_health_and_extra_fields(http: aiohttp.ClientSession, sim: SimServer) -> None:
    async with http.get(f"{sim.url}/v1/models") as resp:
        models = await resp.json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["mmgate-sim-vl"]
    async with http.get(f"{sim.url}/health") as resp:
        assert resp.status == 200
    body = chat_body(max_tokens=2, temperature=0.3, top_p=0.9, seed=7, some_future_field={"x": 1})
    body["messages"].insert(0, {"role": "system", "content": "be brief"})
    body["messages"] += [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "t1", "type": "function",
                                                              "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "result"},
        {"role": "user", "content": "and now?"},
    ]
    del body["model"]  # optional, as in vLLM: the served model
    status, out = await post_chat(http, sim, body)
    assert status == 200 and out["usage"]["completion_tokens"] == 2


async def test_client_disconnect_stops_the_stream(http: aiohttp.ClientSession, make_sim: Any) -> None:
    sim = await make_sim(speedup=1.0, decode_ms_per_token=20.0, prefill_us_per_text_token=0.0)
    body = chat_body(max_tokens=500, ignore_eos=True, stream=True)
    async with http.post(f"{sim.url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        await resp.content.readuntil(b"\n\n")  # the role chunk
        resp.close()  # drop the connection mid-stream
    for _ in range(200):  # bounded wait for the server to notice (each step 50 ms)
        if sim.engine.metrics.stats.requests:
            break
        await asyncio.sleep(0.05)
    assert sim.stats.requests == 1
    assert 0 < sim.stats.generation_tokens < 500
    async with http.get(f"{sim.url}/metrics") as m:
        text = await m.text()
    assert 'mmgate_sim_requests_total{status="disconnected"} 1.0' in text
    assert 'vllm:num_requests_running{engine="0",model_name="mmgate-sim-vl"} 0.0' in text


async def test_n_choices_non_streaming_and_streaming(client: AsyncOpenAI) -> None:
    """n=2 as vLLM answers it: two choices, usage over both; streamed, one role chunk per choice."""
    messages: Any = chat_body(text="two answers")["messages"]
    out = await client.chat.completions.create(model="mmgate-sim-vl", messages=messages, max_tokens=4, n=2,
                                               extra_body={"ignore_eos": True})
    assert [c.index for c in out.choices] == [0, 1]
    assert out.usage is not None and out.usage.completion_tokens == 8
    assert out.choices[0].message.content != out.choices[1].message.content
    stream = await client.chat.completions.create(model="mmgate-sim-vl", messages=messages, max_tokens=4, n=2,
                                                  stream=True, stream_options={"include_usage": True},
                                                  extra_body={"ignore_eos": True})
    chunks = [c async for c in stream]
    roles = [c.choices[0].index for c in chunks if c.choices and c.choices[0].delta.role]
    assert roles == [0, 1]
    assert sum(1 for c in chunks if c.choices and c.choices[0].finish_reason) == 2
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8


BODY = {"model": "mmgate-sim-vl", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


async def test_a_completion_through_the_gateway_carries_its_request_id() -> None:
    """The gateway passes ``X-Request-Id`` on and the engine names the completion by it, as vLLM does."""
    async with running_gateway() as gw:
        reply = await call(gw.url, "/v1/chat/completions", BODY, headers={"X-Request-Id": "agent-turn-42"})
        assert reply.status == 200 and reply.json["id"] == "chatcmpl-agent-turn-42"
        plain = await call(gw.url, "/v1/chat/completions", BODY)
        assert plain.json["id"] == "chatcmpl-" + plain.headers["x-request-id"]
