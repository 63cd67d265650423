"""The Anthropic Messages API through a real gateway in front of real sim engines (the sim is an
OpenAI-compatible chat server: the mapped requests run against it): replies and stream events in
Anthropic's shapes, screenshots reused across turns, errors in Anthropic's shape. The field-by-field
agreement with vLLM's own endpoint is proven against real vLLM (tests/vllm/test_messages.py)."""

from __future__ import annotations

from typing import Any

import pytest

from mmgate.anthropic_chat.request import check_messages_body, forward_reason, to_chat_body
from mmgate.config import BackendSpec
from mmgate.errors import InvalidRequestError
from tests.support.agents import call, is_anthropic_error
from tests.support.apps import serving, vllm_like
from tests.support.gateway import gateway_settings, running_gateway, running_sims, vllm_specs
from tests.support.images import png_data_url
from tests.support.recorder import recording_proxy

MODEL = "mmgate-sim-vl"


def img(seed: int) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                        "data": png_data_url(seed).split(",", 1)[1]}}


def turn(*blocks: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": list(blocks)}], **extra}


async def test_reply_and_stream_in_anthropics_shape_with_reuse() -> None:
    async with running_sims(1) as sims, running_gateway(gateway_settings(backends=vllm_specs(sims))) as gw:
        first = await call(gw.url, "/v1/messages", turn({"type": "text", "text": "hi"}, img(1)))
        assert first.status == 200, first.json
        body = first.json
        assert body["type"] == "message" and body["role"] == "assistant" and body["model"] == MODEL
        assert body["content"][0]["type"] == "text" and body["content"][0]["text"]
        assert body["stop_reason"] in ("end_turn", "max_tokens")
        assert body["usage"]["input_tokens"] > 0 and body["usage"]["output_tokens"] > 0
        assert first.reuse()["sent"] == 1
        history = [{"role": "user", "content": [{"type": "text", "text": "hi"}, img(1)]},
                   {"role": "assistant", "content": body["content"]},
                   {"role": "user", "content": [{"type": "text", "text": "and now?"}]}]
        second = await call(gw.url, "/v1/messages", {"model": MODEL, "max_tokens": 8, "messages": history,
                                                     "stream": True})
        assert second.status == 200
        assert second.reuse() == {"sent": 0, "stripped": 1, "referenced": 0, "healed": 0}
        names = [name for name, _ in second.events]
        assert names[0] == "message_start" and names[1] == "content_block_start"
        assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
        assert "content_block_delta" in names
        delta = dict(second.events)["message_delta"]
        assert delta["delta"]["stop_reason"] in ("end_turn", "max_tokens") and delta["usage"]["output_tokens"] > 0
        assert sims[0].stats.images_processed == 1


async def test_tool_result_screenshot_reaches_the_engine_as_a_user_image() -> None:
    async with running_sims(1) as sims, recording_proxy(sims[0].url) as rec:
        async with running_gateway(gateway_settings(backends=vllm_specs([rec]))) as gw:
            body = {"model": MODEL, "max_tokens": 4, "tool_choice": {"type": "none"},
                    "tools": [{"name": "shot", "input_schema": {"properties": {}}}],
                    "messages": [{"role": "user", "content": "go"},
                                 {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot",
                                                                    "input": {"a": 1}}]},
                                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                               "content": [{"type": "text", "text": "ok"}, img(2)]}]}]}
            reply = await call(gw.url, "/v1/messages", body)
            assert reply.status == 200, reply.json
            sent = rec.bodies[-1]
            assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "tool", "user"]
            assert sent["messages"][1]["tool_calls"][0]["function"] == {"name": "shot", "arguments": '{"a": 1}'}
            assert sent["messages"][2] == {"role": "tool", "tool_call_id": "t1", "content": "ok"}
            part = sent["messages"][3]["content"][0]
            assert part["uuid"].startswith("~sha256:") and part["image_url"]["url"].startswith("data:image/png")
            assert sent["tool_choice"] == "none" and sent["parallel_tool_calls"] is True
            assert sent["tools"][0]["function"]["parameters"] == {"properties": {}, "type": "object"}


@pytest.mark.parametrize(("body", "param"), [
    ({"model": MODEL, "messages": []}, "max_tokens"),
    ({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": "x"}]}]},
     "messages[0].content[0].source"),
    ({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "http://10.0.0.1/x.png"}}]}]},
     "messages[0].content[0].source"),
    ({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [
            {"type": "image", "source": {"type": "url", "url": "http://10.0.0.1/x.png"}}]}]}]},
     "messages[0].content[0].content[0].source"),
    ({"model": MODEL, "max_tokens": 4, "tool_choice": {"type": "tool"}, "messages": []}, "tool_choice.name"),
])
async def test_errors_are_anthropic_shaped_and_name_the_field(body: dict[str, Any], param: str) -> None:
    async with running_gateway() as gw:
        reply = await call(gw.url, "/v1/messages", body)
        assert reply.status == 400 and is_anthropic_error(reply), reply.json
        assert f"(param: {param})" in reply.json["error"]["message"]


async def test_unknown_model_and_bad_json() -> None:
    async with running_gateway() as gw:
        missing = await call(gw.url, "/v1/messages", {"model": "nope", "max_tokens": 4, "messages": []})
        assert missing.status == 404 and missing.json["error"]["type"] == "not_found_error"
        broken = await call(gw.url, "/v1/messages", raw=b"{")
        assert broken.status == 400 and is_anthropic_error(broken)
        counted = await call(gw.url, "/v1/messages/count_tokens", {"model": "nope", "messages": []})
        assert counted.status == 404 and is_anthropic_error(counted)


def test_mapping_follows_vllms_rules() -> None:
    body = check_messages_body({
        "model": "m", "max_tokens": 9, "stop_sequences": ["x"], "temperature": 0.5, "top_k": 2, "stream": True,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: h"}, {"type": "text", "text": "sys"}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "tools": [{"name": "f", "input_schema": {}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "only text"}]},
                     {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm"},
                                                       {"type": "text", "text": "a"}]},
                     {"role": "user", "content": [{"type": "redacted_thinking", "data": "x"}]}],
    })
    assert forward_reason(body) is None
    chat, params = to_chat_body(body)
    assert chat["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "only text"},
        {"role": "assistant", "reasoning": "hmm", "content": "a"},
    ]  # a user message left without content is dropped, as vLLM drops it
    assert chat["max_tokens"] == chat["max_completion_tokens"] == 9 and chat["stop"] == ["x"]
    assert chat["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False
    assert params == {}


FORWARDED_SETTINGS = [
    {"thinking": {"type": "disabled"}},  # the effort it means is a probe of the chat template
    # Shapes vLLM's own validation judges (it refuses or coerces them): forwarded, never guessed.
    {"thinking": {"type": "enabled", "budget_tokens": 1023}},
    {"thinking": {"type": "enabled", "budget_tokens": 2048}, "max_tokens": 2048},  # not under max_tokens
    {"thinking": {"type": "enabled", "budget_tokens": "2048"}},
    {"thinking": {"type": "enabled", "budget_tokens": True}},
    {"thinking": {"type": "enabled"}},
    {"thinking": {"type": "sometimes"}},
    {"thinking": {"type": "adaptive", "display": "verbose"}},
    {"thinking": "enabled"},
    {"output_config": {"effort": "extreme"}},
    {"output_config": {"format": {"type": "text"}}},
    {"output_config": {"format": {"schema": "not an object"}}},
    {"output_config": []},
]


@pytest.mark.parametrize("extra", FORWARDED_SETTINGS)
def test_template_dependent_fields_are_forwarded(extra: dict[str, Any]) -> None:
    assert forward_reason(check_messages_body({"model": "m", "max_tokens": 4096, "messages": [], **extra}))
    inline = {"model": "m", "max_tokens": 1, "messages": [{"role": "system", "content": "s"}]}
    assert forward_reason(check_messages_body(inline)) == "inline system message"


def test_plain_thinking_and_output_config_are_mapped_as_vllm_maps_them() -> None:
    """What an agent sends with extended thinking maps onto chat (so its screenshots are stripped)."""
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    body = check_messages_body({
        "model": "m", "max_tokens": 2049, "messages": [{"role": "user", "content": "hi"}],
        "thinking": {"type": "enabled", "budget_tokens": 2048, "display": "omitted"},
        "output_config": {"effort": "high", "format": {"type": "json_schema", "schema": schema}},
    })
    assert forward_reason(body) is None
    chat, _ = to_chat_body(body)
    assert chat["thinking_token_budget"] == 2048 and chat["reasoning_effort"] == "high"
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "json_schema", "schema": schema}}
    adaptive, _ = to_chat_body(check_messages_body({
        "model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}],
        "thinking": {"type": "adaptive"}, "output_config": {"format": {"schema": {}}}}))
    assert not {"thinking_token_budget", "reasoning_effort", "response_format"} & set(adaptive)


def test_disabled_thinking_is_mapped_once_its_effort_is_known() -> None:
    """Its effort is a probe of the replica's chat template (mmgate.api.anthropic.template_probes): unknown,
    the request is forwarded; known, it is vLLM's reasoning_effort, over output_config's."""
    body = check_messages_body({"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}],
                                "thinking": {"type": "disabled"}, "output_config": {"effort": "high"}})
    assert forward_reason(body) == "thinking" and forward_reason(body, "low") is None
    assert to_chat_body(body, "low")[0]["reasoning_effort"] == "low"
    assert to_chat_body(body, "none")[0]["reasoning_effort"] == "none"


def test_inline_system_messages_are_mapped_once_vllms_choice_is_known() -> None:
    body = check_messages_body({"model": "m", "max_tokens": 9, "system": "top. ", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": [{"type": "text", "text": "x-anthropic-billing-header: 1"},
                                       {"type": "text", "text": "mid"}]},
        {"role": "system", "content": "x-anthropic-billing-header: 2"},
        {"role": "user", "content": "go"}]})
    assert forward_reason(body) == "inline system message"
    assert forward_reason(body, merge_inline_system=False) is None
    merged, _ = to_chat_body(body, merge_inline_system=True)
    assert merged["messages"] == [{"role": "system", "content": "top. mid"}, {"role": "user", "content": "hi"},
                                  {"role": "user", "content": "go"}]
    kept, _ = to_chat_body(body, merge_inline_system=False)
    assert kept["messages"] == [{"role": "system", "content": "top. "}, {"role": "user", "content": "hi"},
                                {"role": "system", "content": "mid"}, {"role": "user", "content": "go"}]


def test_count_tokens_needs_no_max_tokens() -> None:
    check_messages_body({"model": "m", "messages": []}, count_tokens=True)
    with pytest.raises(InvalidRequestError) as caught:
        check_messages_body({"model": "m", "messages": []})
    assert caught.value.param == "max_tokens"


async def test_stream_frames_split_anywhere_map_the_same() -> None:
    """The backend's bytes arrive in arbitrary pieces: the events do not depend on where they split."""
    from mmgate.api.anthropic.stream import events

    frames = (b'data: {"id":"c","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],'
              b'"usage":{"prompt_tokens":3,"completion_tokens":0}}\n\n'
              b'data: {"id":"c","model":"m","choices":[{"index":0,"delta":{"content":"h\xc3\xa9"},'
              b'"finish_reason":"stop","stop_reason":null}]}\n\n'
              b'data: {"id":"c","model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\n'
              b"data: [DONE]\n\n")

    async def pieces(size: int) -> Any:
        for i in range(0, len(frames), size):
            yield frames[i:i + size]

    whole = b"".join([e async for e in events(pieces(len(frames)))])
    for size in (1, 7, 64):
        assert b"".join([e async for e in events(pieces(size))]) == whole
    assert whole.count(b"event: ") == 6 and "hé".encode() in whole
    assert b'"stop_reason":"end_turn"' in whole


async def test_a_broken_backend_stream_ends_with_an_error_event() -> None:
    from mmgate.api.anthropic.stream import events

    async def broken() -> Any:
        yield b'data: {"id":"c","model":"m","choices":[{"index":0,"delta":{"content":""}}]}\n\n'
        yield b'data: {"error": {"message": "engine died", "type": "InternalServerError"}}\n\n'
        yield b'data: {"id":"c","model":"m","choices":[{"index":0,"delta":{"content":"late"}}]}\n\n'

    out = b"".join([e async for e in events(broken())])
    assert out.startswith(b"event: message_start") and out.rstrip().split(b"\n")[-2] == b"event: error"
    assert b"late" not in out


@pytest.mark.parametrize(("extra", "param", "stream"), [
    ({"max_tokens": 8, "thinking": {"type": "enabled", "budget_tokens": 500}}, "thinking", False),
    ({"output_config": {"effort": "extreme"}}, "output_config", True),
])
async def test_a_shape_forwarded_to_an_engine_without_messages_names_its_field(
        extra: dict[str, Any], param: str, stream: bool) -> None:
    """The gateway forwards what it does not map to the backend's own /v1/messages; a chat-only
    engine (an OpenAI-compatible server with no Messages API: a real aiohttp app on loopback)
    serves none, and the client learns which field and why, not the engine's bare 404."""
    async with serving(vllm_like(MODEL, {})) as url, running_gateway(gateway_settings(
            backends=(BackendSpec(kind="vllm", url=url, name="chat-only"),))) as gw:
        reply = await call(gw.url, "/v1/messages", turn({"type": "text", "text": "hi"}, stream=stream, **extra))
        assert reply.status == 400 and is_anthropic_error(reply), reply.raw
        message = reply.json["error"]["message"]
        assert f"(param: {param})" in message and "chat-only serves no /v1/messages" in message, message
        counted = await call(gw.url, "/v1/messages/count_tokens", {"model": MODEL, "messages": []})
        assert counted.status == 404 and counted.json["error"]["type"] == "not_found_error", counted.raw
        assert "serves no /v1/messages/count_tokens" in counted.json["error"]["message"]
