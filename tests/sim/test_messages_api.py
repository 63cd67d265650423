"""The sim's ``/v1/messages``, Anthropic's Messages API over its chat path as vLLM 0.32 serves it,
and what that path gained for it: stop strings and ``thinking_token_budget`` (checked as vLLM
checks it, taken with ``--reasoning-parser``). Each answer's agreement with real vLLM, case by case,
is ``tests/vllm/test_sim_fidelity.py::test_sims_messages_api_answers_as_vllms``; these tests run
without vLLM, against real sim engines on loopback."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from mmgate.sim.generation import GenerationPlan, stopped
from tests.support.agents import call, is_anthropic_error
from tests.support.gateway import running_gateway
from tests.support.images import make_image

MODEL = "mmgate-sim-vl"
PNG = base64.b64encode(make_image("PNG", 64, 48, seed=5)).decode()


def ask(*blocks: dict[str, Any], **fields: Any) -> dict[str, Any]:
    content: Any = list(blocks) or "Where do I click?"
    return {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": content}], **fields}


def image(data: str = PNG) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}


async def test_a_message_and_its_stream_are_the_chat_answer_mapped(make_sim: Any) -> None:
    sim = await make_sim()
    body = ask({"type": "text", "text": "What is this?"}, image(), system="Be terse.")
    chat_body = {"model": MODEL, "max_tokens": 4, "messages": [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                     {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]}]}
    whole = await call(sim.url, "/v1/messages", body)
    chat = await call(sim.url, "/v1/chat/completions", chat_body)
    assert whole.status == chat.status == 200, whole.json
    message = whole.json
    assert (message["type"], message["role"], message["stop_reason"]) == ("message", "assistant", "max_tokens")
    assert message["content"] == [{"type": "text", "text": chat.json["choices"][0]["message"]["content"]}]
    assert message["usage"] == {"input_tokens": chat.json["usage"]["prompt_tokens"], "output_tokens": 4}
    streamed = await call(sim.url, "/v1/messages", {**body, "stream": True})
    names = [name for name, _ in streamed.events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"], names
    text = "".join(data["delta"]["text"] for name, data in streamed.events if name == "content_block_delta")
    assert text == message["content"][0]["text"]
    assert sim.stats.cache_hits >= 2  # the same image three times: processed once


@pytest.mark.parametrize(("body", "param"), [
    ({"model": MODEL, "messages": []}, "body.max_tokens"),  # required
    (ask(max_tokens=0), "body.max_tokens"),
    (ask(temperature="hot"), "body.temperature"),
    ({**ask(), "messages": [{"role": "tool", "content": "x"}]}, "body.messages.0.role"),
    (ask(tool_choice={"type": "sometimes"}), "body.tool_choice.type"),
    (ask(thinking={"type": "enabled", "budget_tokens": 500}, max_tokens=4000), "body.thinking.enabled.budget_tokens"),
    (ask(thinking={"type": "enabled", "budget_tokens": 2048}, max_tokens=2048), "body"),
    (ask(thinking={"type": "sometimes"}), "body.thinking"),
])
async def test_what_vllms_request_model_refuses_is_its_validation_400(make_sim: Any, body: dict[str, Any],
                                                                     param: str) -> None:
    sim = await make_sim()
    reply = await call(sim.url, "/v1/messages", body)
    assert reply.status == 400 and reply.json["error"]["type"] == "Bad Request", reply.json
    assert reply.json["error"]["param"] == param and "type" not in reply.json  # OpenAI's shape, as vLLM's handler


@pytest.mark.parametrize(("body", "status", "kind"), [
    ({**ask(), "model": "nope"}, 404, "NotFoundError"),
    (ask(image("aGVsbG8=")), 400, "BadRequestError"),  # not an image
    (ask({"type": "image", "source": {"type": "file", "file_id": "f1"}}), 400, "BadRequestError"),  # base64 of nothing
    ({**ask(max_tokens="4", stream="yes"), "messages": []}, 400, "BadRequestError"),  # coerced, then empty
    (ask(thinking={"type": "enabled", "budget_tokens": "2048"}, max_tokens=4000), 400, "BadRequestError"),
])
async def test_what_the_chat_path_refuses_is_in_anthropics_shape(make_sim: Any, body: dict[str, Any], status: int,
                                                                 kind: str) -> None:
    sim = await make_sim()
    reply = await call(sim.url, "/v1/messages", body)
    assert reply.status == status and is_anthropic_error(reply), reply.json
    assert reply.json["error"]["type"] == kind


async def test_thinking_is_taken_with_a_reasoning_parser(make_sim: Any) -> None:
    """vLLM takes a ``thinking_token_budget`` only with ``--reasoning-parser``; so does the sim
    (whose model does not think: the answer is text); ``mmgate serve``'s engines have one."""
    thinking = {"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 1030}
    plain = await make_sim()
    refused = await call(plain.url, "/v1/messages", ask(**thinking))
    assert refused.status == 400 and "--reasoning-parser" in refused.json["error"]["message"]
    parsed = await make_sim(reasoning_parser="qwen3")
    taken = await call(parsed.url, "/v1/messages", ask(**thinking))
    assert taken.status == 200 and taken.json["content"][0]["type"] == "text", taken.json
    async with running_gateway() as gw:
        through = await call(gw.url, "/v1/messages", ask(**thinking))
        assert through.status == 200, through.json


async def test_a_stop_string_ends_the_answer_as_vllms_does(make_sim: Any) -> None:
    sim = await make_sim()
    free = await call(sim.url, "/v1/chat/completions", {**ask(), "max_tokens": 30})
    text = free.json["choices"][0]["message"]["content"]
    word = text.split()[2]  # a word the answer holds, past its first two
    cut = await call(sim.url, "/v1/chat/completions", {**ask(), "max_tokens": 30, "stop": [word, "zzz"]})
    choice = cut.json["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", word)
    assert choice["message"]["content"] == text[:text.index(word)]
    assert cut.json["usage"]["completion_tokens"] == 3
    message = await call(sim.url, "/v1/messages", ask(max_tokens=30, stop_sequences=[word]))
    assert (message.json["stop_reason"], message.json["stop_sequence"]) == ("stop_sequence", word)
    bad = await call(sim.url, "/v1/chat/completions", {**ask(), "stop": 5})
    assert bad.status == 400 and bad.json["error"]["param"] == "stop"


def test_the_stop_string_completed_first_wins_past_min_tokens() -> None:
    plan = GenerationPlan(("ab", "cd", "ef"), "length")
    assert stopped(plan, ["cde", "d"]) == GenerationPlan(("ab", "c"), "stop", "d")  # "d" ends first
    assert stopped(plan, ["bcd"]) == GenerationPlan(("a", ""), "stop", "bcd")  # across tokens: both counted
    assert stopped(plan, ["zz", ""]) is plan
    assert stopped(plan, ["b", "e"], min_tokens=2) == GenerationPlan(("ab", "cd", ""), "stop", "e")


async def test_count_tokens_counts_the_prompt_a_message_would_have(make_sim: Any) -> None:
    """vLLM renders a count request as it would the message, images included, without generating:
    no ``max_tokens``, and a thinking budget is no reason to refuse it."""
    sim = await make_sim()
    body = ask({"type": "text", "text": "What is this?"}, image(), system="Be terse.")
    message = await call(sim.url, "/v1/messages", body)
    count = await call(sim.url, "/v1/messages/count_tokens", {k: v for k, v in body.items() if k != "max_tokens"})
    assert count.status == 200, count.json
    assert count.json == {"input_tokens": message.json["usage"]["input_tokens"],
                          "context_management": {"original_input_tokens": message.json["usage"]["input_tokens"]}}
    thinking = await call(sim.url, "/v1/messages/count_tokens", {
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}],
        "thinking": {"type": "enabled", "budget_tokens": 2048}})
    assert thinking.status == 200 and thinking.json["input_tokens"] > 0, thinking.json
    unknown = await call(sim.url, "/v1/messages/count_tokens", {"model": "nope", "messages": []})
    assert unknown.status == 404 and is_anthropic_error(unknown)
    async with running_gateway() as gw:
        through = await call(gw.url, "/v1/messages/count_tokens", {"model": MODEL, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}, image()]}]})
        assert through.status == 200 and through.json["input_tokens"] > 0, through.json
