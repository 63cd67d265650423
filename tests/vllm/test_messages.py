"""The Anthropic Messages API through the gateway against real vLLM: the same answers as vLLM's
own ``/v1/messages`` (a differential corpus at temperature 0, plain and streamed), repeated
screenshots sent as cache-only references (vLLM's processor cache hits move), and bad input
answered with a 4xx in Anthropic's error shape, never a 500."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.support.agents import Reply, call, is_anthropic_error
from tests.support.vllm import SERVED_MODEL, GatewayProcess, VllmReplica
from tests.vllm.helpers import fresh_jpeg

M = SERVED_MODEL
SHOT = fresh_jpeg()
SHOT_B64 = SHOT.split(",", 1)[1]
TOOLS = [{"name": "screenshot", "description": "Take a screenshot",
          "input_schema": {"type": "object", "properties": {"region": {"type": "string"}}}}]


def img(data_url: str = SHOT) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": data_url.split(",", 1)[1]}}


def req(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": M, "max_tokens": 6, "temperature": 0, "messages": messages, **extra}


CORPUS: dict[str, dict[str, Any]] = {
    "text": req([{"role": "user", "content": "Hello"}]),
    "system-string": req([{"role": "user", "content": "Hi"}], system="You are terse."),
    "system-blocks": req([{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                         system=[{"type": "text", "text": "x-anthropic-billing-header: 1"},
                                 {"type": "text", "text": "You are terse."}]),
    "image": req([{"role": "user", "content": [{"type": "text", "text": "What is this?"}, img()]}]),
    "stop-sequences": req([{"role": "user", "content": "Hi"}], max_tokens=40, stop_sequences=["\n", "a", "e"]),
    "top-p-top-k": req([{"role": "user", "content": "Hi"}], temperature=0.0, top_p=0.5, top_k=3),
    "tool-results-with-screenshots": req(
        [{"role": "user", "content": [{"type": "text", "text": "Open the page"}, img()]},
         {"role": "assistant", "content": [{"type": "text", "text": "Taking a screenshot."},
                                           {"type": "tool_use", "id": "tu_1", "name": "screenshot",
                                            "input": {"region": "all"}}]},
         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1",
                                       "content": [{"type": "text", "text": "done"}, img()]}]},
         {"role": "assistant", "content": [{"type": "tool_use", "id": "tu_2", "name": "screenshot", "input": {}}]},
         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_2", "content": "no change"}]}],
        tools=TOOLS, tool_choice={"type": "none"}),
    "assistant-tool-result": req(
        [{"role": "user", "content": "Hi"},
         {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "x",
                                            "content": [{"type": "text", "text": "r"}]}]},
         {"role": "user", "content": "Go on"}]),
    # The test replicas run without a tool parser: vLLM answers these with its 400, and so must the gateway.
    "tools-auto": req([{"role": "user", "content": "Hi"}], tools=TOOLS),
    "tool-named": req([{"role": "user", "content": "Hi"}], tools=TOOLS,
                      tool_choice={"type": "tool", "name": "screenshot"}),
    "unknown-model": {**req([{"role": "user", "content": "Hi"}]), "model": "no-such-model"},
    # Mapped once the gateway has probed the replica's chat template as vLLM does.
    "inline-system": req([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yes?"},
                          {"role": "system", "content": "Be terse."}, {"role": "user", "content": "Go"}]),
    "thinking-disabled": req([{"role": "user", "content": [{"type": "text", "text": "Hi"}, img()]}],
                             thinking={"type": "disabled"}),  # vLLM probes its effort, and so does the gateway
    # Mapped: an agent with extended thinking gets its repeats stripped (vLLM's own mapping). The
    # test replicas have no reasoning parser, so vLLM refuses a thinking budget, mapped or not.
    "thinking-adaptive": req([{"role": "user", "content": [{"type": "text", "text": "Hi"}, img()]}],
                             thinking={"type": "adaptive"}),
    "thinking-enabled": req([{"role": "user", "content": [{"type": "text", "text": "Hi"}, img()]}],
                            thinking={"type": "enabled", "budget_tokens": 1024}, max_tokens=1025),
    "output-config": req([{"role": "user", "content": [{"type": "text", "text": "Hi"}, img()]}],
                         output_config={"effort": "low", "format": {"type": "json_schema", "schema": {
                             "type": "object", "properties": {"a": {"type": "integer"}}}}}),
}


async def _pair(gateway: GatewayProcess, replicas: list[VllmReplica], path: str, body: dict[str, Any]) -> tuple[Reply, Reply]:
    """The gateway's answer, then the answer of the replica it chose (the first one for errors)."""
    via = await call(gateway.url, path, body)
    name = via.headers.get("x-mmgate-backend")
    replica = replicas[int(name.rsplit("-", 1)[1])] if name else replicas[0]
    direct = await call(replica.url, path, body)
    return via, direct


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("name", list(CORPUS))
async def test_same_answer_as_vllms_own_endpoint(
    gateway: GatewayProcess, vllm_replicas: list[VllmReplica], name: str, stream: bool
) -> None:
    via, direct = await _pair(gateway, vllm_replicas, "/v1/messages", {**CORPUS[name], "stream": stream})
    if name == "unknown-model":
        # The gateway's own 404 (it knows the fleet's models), in Anthropic's shape as vLLM's.
        assert via.status == direct.status == 404 and is_anthropic_error(via) and is_anthropic_error(direct)
        return
    if name == "thinking-enabled" and stream:
        # vLLM's own stream fails to convert its chat refusal (its error event reads "2 validation
        # errors for ChatCompletionStreamResponse"); the gateway's carries the refusal itself.
        assert [e for e, _ in via.events] == [e for e, _ in direct.events] == ["error"]
        assert "thinking_token_budget" in via.events[0][1]["error"]["message"]
        assert via.headers.get("x-mmgate-forwarded") is None
        return
    assert via.normalised() == direct.normalised()
    if name == "thinking-enabled":
        assert via.status == 400 and "thinking_token_budget" in via.json["error"]["message"]
    if via.status == 200 and stream:
        names = [event for event, _ in via.events]
        assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    if via.status == 200:  # inline system and thinking: disabled too, once the template is probed
        assert via.headers.get("x-mmgate-forwarded") is None, name


async def test_disabled_thinking_means_the_effort_vllm_probes(
    gateway: GatewayProcess, vllm_replicas: list[VllmReplica],
) -> None:
    """The gateway probes what thinking: disabled means on the replicas' template as vLLM does, and
    logs its answer: vLLM's own probe's."""
    body = req([{"role": "user", "content": "Hi"}], thinking={"type": "disabled"})
    via, direct = await _pair(gateway, vllm_replicas, "/v1/messages", body)
    assert via.status == direct.status == 200 and via.headers.get("x-mmgate-forwarded") is None
    ours = re.findall(r"disabled_effort for model '[^']*' on backend \S+: '(\w+)'", gateway.log_path.read_text())
    said = re.compile(r"thinking\.type=disabled maps to reasoning_effort='(\w+)'")
    theirs = [e for r in vllm_replicas for e in said.findall(r.log_path.read_text())]
    assert ours and theirs and set(ours) == set(theirs), (ours, theirs)


async def test_count_tokens_same_as_vllm(gateway: GatewayProcess, vllm_replicas: list[VllmReplica]) -> None:
    body = {"model": M, "system": "Be terse.",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, img()]}]}
    via, direct = await _pair(gateway, vllm_replicas, "/v1/messages/count_tokens", body)
    assert via.status == 200 and via.json == direct.json
    assert via.json["input_tokens"] > 64  # the image's tokens are counted
    # Tools without a tool_choice mean "auto", which these replicas refuse: the same 400 either way.
    via, direct = await _pair(gateway, vllm_replicas, "/v1/messages/count_tokens", {**body, "tools": TOOLS})
    assert via.status == direct.status == 400 and via.json == direct.json


async def test_second_turn_sends_the_repeated_screenshot_as_a_reference(
    gateway: GatewayProcess, vllm_replicas: list[VllmReplica]
) -> None:
    """An unmodified Messages client resends its whole history: the gateway sends each screenshot
    once per replica, then a cache-only reference that is a real processor-cache hit."""
    headers = {"x-session-id": "messages-reuse"}
    first_shot, second_shot = fresh_jpeg(), fresh_jpeg()
    turn1 = [{"role": "user", "content": [{"type": "text", "text": "Click OK"}, img(first_shot)]}]
    one = await call(gateway.url, "/v1/messages", req(turn1, tools=TOOLS, tool_choice={"type": "none"}), headers=headers)
    assert one.status == 200, one.json
    assert one.reuse() == {"sent": 1, "stripped": 0, "referenced": 0, "healed": 0}
    replica = vllm_replicas[int(one.headers["x-mmgate-backend"].rsplit("-", 1)[1])]
    _, hits_before = replica.cache_counters()
    turn2 = [*turn1,
             {"role": "assistant", "content": [{"type": "tool_use", "id": "tu_1", "name": "screenshot", "input": {}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1",
                                           "content": [img(second_shot)]}]}]
    two = await call(gateway.url, "/v1/messages", req(turn2, tools=TOOLS, tool_choice={"type": "none"}, stream=True),
                     headers=headers)
    assert two.status == 200
    assert two.headers["x-mmgate-backend"] == one.headers["x-mmgate-backend"]
    assert two.reuse() == {"sent": 1, "stripped": 1, "referenced": 0, "healed": 0}
    _, hits_after = replica.cache_counters()
    assert hits_after >= hits_before + 1
    # And the answer is the one vLLM gives to the full request.
    direct = await call(replica.url, "/v1/messages", req(turn2, tools=TOOLS, tool_choice={"type": "none"}, stream=True))
    assert two.normalised() == direct.normalised()


BAD: dict[str, Any] = {
    "not-json": b"{not json",
    "array-body": b"[]",
    "no-model": {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
    "no-max-tokens": {"model": M, "messages": [{"role": "user", "content": "hi"}]},
    "max-tokens-zero": {"model": M, "max_tokens": 0, "messages": []},
    "max-tokens-string": {"model": M, "max_tokens": "5", "messages": []},
    "max-tokens-bool": {"model": M, "max_tokens": True, "messages": []},
    "messages-object": {"model": M, "max_tokens": 5, "messages": {"role": "user"}},
    "bad-role": {"model": M, "max_tokens": 5, "messages": [{"role": "tool", "content": "hi"}]},
    "content-number": {"model": M, "max_tokens": 5, "messages": [{"role": "user", "content": 7}]},
    "block-type": {"model": M, "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "video"}]}]},
    "block-not-object": {"model": M, "max_tokens": 5, "messages": [{"role": "user", "content": ["hi"]}]},
    "image-no-source": {"model": M, "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
    "image-source-string": {"model": M, "max_tokens": 5,
                            "messages": [{"role": "user", "content": [{"type": "image", "source": "x"}]}]},
    "image-private-url": {"model": M, "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "http://10.1.2.3/a.png"}}]}]},
    "image-metadata-url": {"model": M, "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "http://169.254.169.254/latest"}}]}]},
    "image-file-source": {"model": M, "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "file", "file_id": "file_1"}}]}]},
    "image-bad-base64": {"model": M, "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "!!!"}}]}]},
    "image-not-an-image": {"model": M, "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGVsbG8="}}]}]},
    "tool-result-private-url": {"model": M, "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [
            {"type": "image", "source": {"type": "url", "url": "http://127.0.0.2:1/x.png"}}]}]}]},
    "forwarded-private-url": {"model": M, "max_tokens": 5, "thinking": {"type": "adaptive"}, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://10.0.0.1/a"}}]}]},
    "tool-no-schema": {"model": M, "max_tokens": 5, "tools": [{"name": "f"}], "messages": []},
    "tools-object": {"model": M, "max_tokens": 5, "tools": {"name": "f"}, "messages": []},
    "tool-choice-type": {"model": M, "max_tokens": 5, "tool_choice": {"type": "sometimes"}, "messages": []},
    "tool-choice-no-name": {"model": M, "max_tokens": 5, "tool_choice": {"type": "tool"}, "messages": []},
    "stop-not-list": {"model": M, "max_tokens": 5, "stop_sequences": "\n", "messages": []},
    "temperature-string": {"model": M, "max_tokens": 5, "temperature": "hot", "messages": []},
    "stream-string": {"model": M, "max_tokens": 5, "stream": "yes", "messages": []},
    "tool-use-input-list": {"model": M, "max_tokens": 5, "messages": [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": [1]}]}]},
    "deep-nesting": b'{"model": "m", "max_tokens": 5, "metadata": {"a": ' + b"[" * 80 + b"]" * 80 + b'}, "messages": []}',
    "unknown-model": {"model": "nope", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
}


@pytest.mark.parametrize("name", list(BAD))
async def test_bad_input_is_a_4xx_in_anthropics_shape(gateway: GatewayProcess, name: str) -> None:
    case = BAD[name]
    raw = case if isinstance(case, bytes) else None
    reply = await call(gateway.url, "/v1/messages", None if raw else case, raw=raw)
    assert 400 <= reply.status < 500, (reply.status, reply.json)
    assert is_anthropic_error(reply), reply.json
    counted = await call(gateway.url, "/v1/messages/count_tokens", None if raw else case, raw=raw)
    assert counted.status < 500 and (counted.status == 200 or is_anthropic_error(counted)), counted.json
