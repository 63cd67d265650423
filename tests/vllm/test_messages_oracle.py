"""The gateway's Messages mapping against vLLM's own code as the oracle, for what the tiny test
model cannot produce on demand (tool calls, reasoning, text after a tool call): vLLM 0.32's
``AnthropicServingMessages`` converters run in the vLLM venv on the same inputs, and the gateway's
mapping must give the same chat request, the same whole message and the same stream events."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import orjson
import pytest

from mmgate.anthropic_chat.reply import message_from_chat
from mmgate.anthropic_chat.request import check_messages_body, to_chat_body
from mmgate.anthropic_chat.stream import StreamMapper
from tests.support.vllm import VllmSetup, VllmUnavailable

ORACLE = r'''
import asyncio, json, sys
from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest
from vllm.entrypoints.anthropic.serving import AnthropicServingMessages as S
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest, ChatCompletionResponse

cases = json.load(sys.stdin)
out = {"requests": [], "whole": [], "streams": []}
for anthropic, mine, merge in cases["requests"]:
    theirs = S.to_chat_completion_request(AnthropicMessagesRequest.model_validate(anthropic),
                                          merge_inline_system=merge)
    ours = ChatCompletionRequest.model_validate(mine)
    a, b = theirs.model_dump(mode="json"), ours.model_dump(mode="json")
    a.pop("request_id"); b.pop("request_id")
    out["requests"].append([a, b])
self = object.__new__(S)
for chat in cases["whole"]:
    out["whole"].append(self.messages_full_converter(ChatCompletionResponse.model_validate(chat)).model_dump(exclude_none=True, mode="json"))
async def run(frames):
    async def gen():
        for f in frames:
            yield f
    return [e async for e in self.message_stream_converter(gen())]
for frames in cases["streams"]:
    out["streams"].append(asyncio.run(run(frames)))
print(json.dumps(out))
'''

TOOLS = [{"name": "click", "description": "Click", "input_schema": {"properties": {"x": {"type": "integer"}}}}]
IMG = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
REQUESTS: list[dict[str, Any]] = [
    {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
    {"model": "m", "max_tokens": 9, "system": [{"type": "text", "text": "x-anthropic-billing-header: 1"},
                                               {"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
     "stop_sequences": ["\n"], "temperature": 0.2, "top_p": 0.9, "top_k": 4, "stream": True,
     "tools": TOOLS, "tool_choice": {"type": "tool", "name": "click", "disable_parallel_tool_use": True},
     "cache_salt": "s", "chat_template_kwargs": {"k": 1},
     "messages": [
         {"role": "user", "content": [{"type": "text", "text": "look"}, IMG,
                                      {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                   "data": "AAAA"}}]},
         {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"},
                                           {"type": "redacted_thinking", "data": "d"},
                                           {"type": "text", "text": "ok"},
                                           {"type": "tool_use", "id": "tu", "name": "click", "input": {"x": 1, "y": [2]}},
                                           {"type": "tool_use", "id": "tv", "name": "click", "input": {}}]},
         {"role": "user", "content": [
             {"type": "tool_result", "tool_use_id": "tu", "content": [{"type": "text", "text": "a"},
                                                                      {"type": "text", "text": "b"}, IMG,
                                                                      {"type": "tool_reference", "tool_name": "z"}]},
             {"type": "tool_result", "tool_use_id": "tv", "content": "plain", "is_error": True},
             {"type": "text", "text": "next"}]},
         {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "q",
                                            "content": [{"type": "text", "text": "r", "n": 1.5, "b": True}]}]},
         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "w"}]},
     ]},
    {"model": "m", "max_tokens": 5, "tools": TOOLS, "tool_choice": {"type": "any"},
     "messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}, {"role": "user", "content": "x"}]},
    {"model": "m", "max_tokens": 5, "tool_choice": {"type": "none"}, "messages": [{"role": "assistant", "content": []}]},
    # Extended thinking and output settings in their plain shapes are mapped, not forwarded.
    {"model": "m", "max_tokens": 5000, "messages": [{"role": "user", "content": [IMG]}],
     "thinking": {"type": "enabled", "budget_tokens": 4096, "display": "summarized"},
     "output_config": {"effort": "xhigh", "format": {"type": "json_schema",
                                                     "schema": {"type": "object", "required": ["a"]}}}},
    {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
     "thinking": {"type": "adaptive"}, "output_config": {"effort": "low", "format": {"schema": {}}}},
    {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
     "thinking": {"type": "adaptive", "budget_tokens": 7}, "output_config": {"format": None}},
    {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
     "thinking": {"type": "disabled"}, "output_config": {"effort": "high"}},
]


INLINE_SYSTEM = {"model": "m", "max_tokens": 5, "system": [{"type": "text", "text": "Top."}], "messages": [
    {"role": "user", "content": [{"type": "text", "text": "look"}, IMG]},
    {"role": "system", "content": "Be terse."},
    {"role": "assistant", "content": "ok"},
    {"role": "system", "content": [{"type": "text", "text": "x-anthropic-billing-header: 9"},
                                   {"type": "text", "text": "Now "}, {"type": "text", "text": "go."}]},
    {"role": "system", "content": "x-anthropic-billing-header: 9"},
    {"role": "user", "content": "next"}]}
# Each request mapped as vLLM maps it with inline system messages merged (True) or kept in place.
CASES = [(body, False) for body in REQUESTS] + [(INLINE_SYSTEM, False), (INLINE_SYSTEM, True)]


def _chunk(delta: dict[str, Any], finish: str | None = None, stop: Any = None, usage: Any = None) -> str:
    choice = {"index": 0, "delta": delta, "finish_reason": finish, "stop_reason": stop}
    body = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice]}
    if usage is not None:
        body["usage"] = usage
    return "data: " + json.dumps(body) + "\n\n"


def _usage(prompt: int, completion: int, cached: int | None = None) -> dict[str, Any]:
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                             "total_tokens": prompt + completion}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


def _last(usage: dict[str, Any]) -> str:
    return "data: " + json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                                  "model": "m", "choices": [], "usage": usage}) + "\n\n"


def _call(index: int, call_id: str | None, name: str | None, args: str) -> dict[str, Any]:
    call: dict[str, Any] = {"index": index, "function": {"arguments": args}}
    if call_id is not None:
        call.update(id=call_id, type="function")
        call["function"]["name"] = name
    return call


STREAMS: list[list[str]] = [
    [_chunk({"role": "assistant", "content": ""}, usage=_usage(10, 0)),
     _chunk({"reasoning": "think"}), _chunk({"reasoning": " more"}), _chunk({"content": "Hel"}),
     _chunk({"content": "lo"}), _chunk({"content": ""}, finish="stop", stop="\n"), _last(_usage(10, 4, cached=3)),
     "data: [DONE]\n\n"],
    [_chunk({"role": "assistant", "content": ""}, usage=_usage(7, 0)), _chunk({"content": "I will"}),
     _chunk({"tool_calls": [_call(0, "call_a", "click", "")]}),
     _chunk({"tool_calls": [_call(0, None, None, '{"x": ')]}), _chunk({"content": "stray"}),
     _chunk({"tool_calls": [_call(0, None, None, "1}")]}),
     _chunk({"tool_calls": [_call(1, "call_b", "click", '{"x"')]}),
     _chunk({}, finish="tool_calls"), _last(_usage(7, 9)), "data: [DONE]\n\n"],
    [_chunk({"role": "assistant", "content": ""}, usage=_usage(3, 0)), _chunk({"content": "x"}, finish="length"),
     _last(_usage(3, 1)), "data: [DONE]\n\n"],
]
WHOLE: list[dict[str, Any]] = [
    {"id": "chatcmpl-2", "object": "chat.completion", "created": 1, "model": "m",
     "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi", "tool_calls": [
         {"id": "call_1", "type": "function", "function": {"name": "click", "arguments": '{"x": 1}'}}]},
                  "finish_reason": "stop", "stop_reason": None}],
     "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7,
               "prompt_tokens_details": {"cached_tokens": 2}}},
    {"id": "chatcmpl-3", "object": "chat.completion", "created": 1, "model": "m",
     "choices": [{"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "stop",
                  "stop_reason": "END"}], "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}},
    {"id": "chatcmpl-4", "object": "chat.completion", "created": 1, "model": "m",
     "choices": [{"index": 0, "message": {"role": "assistant", "content": "a", "reasoning": "r"},
                  "finish_reason": "length", "stop_reason": None}],
     "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}},
]


@pytest.fixture(scope="module")
def oracle() -> dict[str, Any]:
    try:
        setup = VllmSetup.locate()
    except VllmUnavailable as exc:
        pytest.skip(str(exc))
    requests = []
    for body, merge in CASES:
        # vLLM's converter's default effort for thinking: disabled (its probe's answer comes apart).
        chat, _ = to_chat_body(check_messages_body(json.loads(json.dumps(body))), "none", merge)
        requests.append([body, chat, merge])
    cases = {"requests": requests, "whole": WHOLE, "streams": STREAMS}
    done = subprocess.run([str(setup.python), "-c", ORACLE], input=json.dumps(cases), capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("index", range(len(CASES)))
def test_same_chat_request_as_vllm(oracle: dict[str, Any], index: int) -> None:
    theirs, ours = oracle["requests"][index]
    for message in theirs["messages"]:  # vLLM names a tool_use without an id by the clock
        for call in message.get("tool_calls") or []:
            call.pop("id", None)
    for message in ours["messages"]:
        for call in message.get("tool_calls") or []:
            call.pop("id", None)
    assert ours == theirs


def _signatures_blanked(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: ("*" if k == "signature" else _signatures_blanked(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_signatures_blanked(v) for v in node]
    return node


@pytest.mark.parametrize("index", range(len(WHOLE)))
def test_same_whole_message_as_vllm(oracle: dict[str, Any], index: int) -> None:
    assert _signatures_blanked(message_from_chat(WHOLE[index])) == _signatures_blanked(oracle["whole"][index])


@pytest.mark.parametrize("index", range(len(STREAMS)))
def test_same_stream_events_as_vllm(oracle: dict[str, Any], index: int) -> None:
    mapper = StreamMapper()
    ours = b"".join(mapper.feed(frame[len("data: "):].strip()) for frame in STREAMS[index]).decode()
    theirs = "".join(oracle["streams"][index])

    def events(text: str) -> list[Any]:
        out = []
        for frame in text.split("\n\n"):
            if frame:
                name, data = frame.split("\n", 1)
                out.append((name, _signatures_blanked(orjson.loads(data[len("data: "):]))))
        return out

    assert events(ours) == events(theirs)
    # Byte for byte, apart from the random thinking signature.
    if "signature_delta" not in theirs:
        assert ours == theirs
