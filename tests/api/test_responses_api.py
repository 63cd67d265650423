"""The Responses API's gateway side without vLLM: which parts are images (and are rewritten for
the backend), what is refused before anything is sent, the response-id map, and the 404 for an id
no backend holds — against a real gateway with real sim engines (which answer ``/v1/responses`` as
a vLLM that stores no response does: ``make run``'s topology). The answers themselves are proven
against real vLLM (tests/vllm/test_responses.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from mmgate.api.openai_responses.homes import ResponseHomes
from mmgate.api.openai_responses.parse import parse_responses_body
from mmgate.errors import InvalidRequestError
from mmgate.reuse.plan import SlotPlan, render
from mmgate.store import LoadedImage
from tests.support.agents import call, is_openai_error
from tests.support.gateway import running_gateway
from tests.support.images import png_data_url
from tests.support.vllm import cache_counters

LIMITS: dict[str, Any] = {"max_images": 8, "max_uuid_length": 64, "max_depth": 32}


def parse(body: Any, **extra: Any) -> Any:
    return parse_responses_body(body, **{**LIMITS, **extra})


def test_images_in_messages_and_tool_outputs_are_slots() -> None:
    url = png_data_url(1)
    body = {"model": "m", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}, {"type": "input_image", "image_url": url}]},
        {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": None, "uuid": "u1"}]},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": [
            {"type": "input_image", "image_url": url, "detail": "low"}]},
        {"type": "function_call_output", "call_id": "d", "output": "text only"},
    ]}
    parsed = parse(body)
    slots = parsed.chat.slots
    assert [s.param for s in slots] == ["input[0].content[1]", "input[1].content[0]", "input[3].output[0]"]
    assert [(s.url is not None, s.uuid) for s in slots] == [(True, None), (False, "u1"), (True, None)]
    assert "uuid" not in slots[1].part  # the client's label is replaced by its namespaced key on render
    image = LoadedImage(data=b"\x89PNG", mime="image/png", width=2, height=2, digest="d" * 64)
    plans = [SlotPlan(slot=slots[0], key="K0", image=image, from_client=True),
             SlotPlan(slot=slots[1], key="K1", image=None, from_client=False),
             SlotPlan(slot=slots[2], key="K0", image=image, from_client=True)]
    counts = render(plans, with_uuid=True, already_sent={"K0"})
    # Responses parts keep their shape: image_url is a string (or null), detail stays a sibling key.
    assert body["input"][0]["content"][1] == {"type": "input_image", "image_url": None, "uuid": "K0"}
    assert body["input"][1]["content"][0] == {"type": "input_image", "image_url": None, "uuid": "K1"}
    assert counts.stripped == 2 and counts.references == 1
    render(plans, with_uuid=True, already_sent=set(), force_data=True)
    tool_image = body["input"][3]["output"][0]
    assert tool_image["image_url"].startswith("data:image/png;base64,") and tool_image["detail"] == "low"


@pytest.mark.parametrize(("item", "param"), [
    ({"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]}, "input[0].content[0].file_id"),
    ({"role": "user", "content": [{"type": "input_file", "file_url": "http://x/a.pdf"}]}, "input[0].content[0]"),
    ({"type": "computer_call_output", "call_id": "c", "output": {"type": "computer_screenshot",
                                                                 "image_url": "http://x/s.png"}}, "input[0].type"),
    ({"role": "user", "content": [{"type": "input_image", "image_url": {"url": "http://x/a.png"}}]},
     "input[0].content[0].image_url"),
    ({"role": "user", "content": [{"type": "input_image"}]}, "input[0].content[0]"),
    ("hi", "input[0]"),
])
def test_refused_before_anything_is_sent(item: Any, param: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        parse({"model": "m", "input": [item]})
    assert caught.value.param == param


def test_model_stream_and_previous_id() -> None:
    assert parse({"input": "hi"}, default_model="only").chat.model == "only"
    with pytest.raises(InvalidRequestError, match="model"):
        parse({"input": "hi"})
    with pytest.raises(InvalidRequestError, match="stream"):
        parse({"model": "m", "input": "hi", "stream": 1})
    assert parse({"model": "m", "input": "hi", "previous_response_id": "resp_1"}).previous_response_id == "resp_1"
    with pytest.raises(InvalidRequestError, match="too many images"):
        parse({"model": "m", "input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": png_data_url(i)} for i in range(3)]}]}, max_images=2)


def test_homes_are_bounded_and_expire() -> None:
    homes = ResponseHomes(max_entries=2, ttl_s=10.0)
    homes.record("a", "b0", 0.0)
    homes.record("b", "b1", 1.0)
    homes.record("c", "b0", 2.0)
    assert len(homes) == 2 and homes.home("a", 3.0) is None  # the oldest went first
    assert homes.home("b", 3.0) == "b1"
    assert homes.home("b", 11.5) is None and len(homes) == 1


async def test_gateway_refusals_and_unknown_ids_in_openais_shape() -> None:
    async with running_gateway() as gw:
        for body in ({"model": "mmgate-sim-vl", "input": [{"type": "computer_call_output", "call_id": "c",
                                                           "output": {"image_url": "http://10.0.0.1/x.png"}}]},
                     {"model": "mmgate-sim-vl", "input": [{"role": "user", "content": [
                         {"type": "input_image", "image_url": "http://10.0.0.1/x.png"}]}]},
                     {"model": "mmgate-sim-vl", "input": 5}):
            reply = await call(gw.url, "/v1/responses", body)
            assert reply.status == 400 and is_openai_error(reply), reply.json
        for method, path in (("GET", "/v1/responses/resp_abc"), ("POST", "/v1/responses/resp_abc/cancel")):
            reply = await call(gw.url, path, method=method)
            assert reply.status == 404 and reply.json["error"]["code"] == "response_not_found"
            assert "no backend holds it" in reply.json["error"]["message"]
        bad = await call(gw.url, "/v1/responses/a%20b", method="GET")
        assert bad.status == 400 and bad.json["error"]["param"] == "response_id"
        lost = await call(gw.url, "/v1/responses", {"model": "mmgate-sim-vl", "input": "hi",
                                                    "previous_response_id": "resp_gone"})
        assert lost.status == 404 and lost.json["error"]["param"] == "previous_response_id"


async def test_an_agent_on_the_embedded_sims_sends_each_screenshot_once() -> None:
    """What ``make run`` gives a Responses agent that resends its screenshots (the SDK, its output
    items appended to its next input): each turn's new screenshot with its bytes, the others as
    cache-only references the sim finds in its processor cache."""
    async with running_gateway() as gw, openai.AsyncOpenAI(
            base_url=gw.url + "/v1", api_key="x", max_retries=0, default_headers={"x-session-id": "agent"}) as sdk:
        items: list[Any] = []
        hits_before = 0.0
        for turn in range(3):
            items.append({"role": "user", "content": [{"type": "input_text", "text": f"step {turn}"},
                                                      {"type": "input_image", "image_url": png_data_url(40 + turn)}]})
            raw = await sdk.responses.with_raw_response.create(model="mmgate-sim-vl", input=items, max_output_tokens=3)
            assert raw.headers["x-mmgate-reuse"] == f"sent=1; stripped={turn}; referenced=0; healed=0"
            answer = raw.parse()
            assert answer.output_text and answer.status == "incomplete"
            items += [item.model_dump(exclude_none=True) for item in answer.output]
            backend = next(b for b in gw.gateway.router.backends if b.name == raw.headers["x-mmgate-backend"])
            _, hits = await asyncio.to_thread(cache_counters, backend.url)
            assert hits == hits_before + turn  # every repeat a hit
            hits_before = hits
