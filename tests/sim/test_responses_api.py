"""The sim's Responses API (``POST /v1/responses``), seen by the openai SDK and by raw aiohttp:
vLLM's response object and event stream, images counted and cached as on chat, and what a vLLM
that stores no response refuses (``mmgate.sim.responses_api``)."""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import pytest

from mmgate.sim.server import SimServer
from tests.support.images import data_url, make_image

MODEL = "mmgate-sim-vl"


@pytest.fixture
async def client(sim: SimServer) -> Any:
    async with openai.AsyncOpenAI(base_url=f"{sim.url}/v1", api_key="x", max_retries=0, timeout=30) as c:
        yield c


def shot(seed: int) -> str:
    return data_url(make_image("PNG", 64, 48, seed=seed), "image/png")


def asks(url: str | None, uuid: str | None = None) -> list[dict[str, Any]]:
    image: dict[str, Any] = {"type": "input_image", "image_url": url, "detail": "auto"}
    if uuid is not None:
        image["uuid"] = uuid
    return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What changed?"}, image]}]


async def post(sim: SimServer, path: str, body: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.post(sim.url + path, json=body) as resp:
        return resp.status, await resp.json()


async def test_a_response_is_vllms_object(client: openai.AsyncOpenAI) -> None:
    cut = await client.responses.create(model=MODEL, input=asks(shot(1)), max_output_tokens=3)
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    assert cut.id.startswith("resp_") and cut.output[0].type == "message" and cut.output[0].id.startswith("msg_")
    assert cut.usage is not None and cut.usage.output_tokens == 3
    text_only = await client.responses.create(model=MODEL, input="What changed?", max_output_tokens=3)
    assert text_only.usage is not None and cut.usage.input_tokens > text_only.usage.input_tokens  # the image's
    told = await client.responses.create(model=MODEL, input="What changed?", max_output_tokens=3,
                                         instructions="You operate a browser and answer in few words.")
    assert told.usage is not None and told.usage.input_tokens > text_only.usage.input_tokens
    assert told.instructions == "You operate a browser and answer in few words."


async def test_the_sdks_stream_helper_accumulates_the_events(client: openai.AsyncOpenAI) -> None:
    kinds: list[str] = []
    numbers: list[int] = []
    deltas = ""
    async with client.responses.stream(model=MODEL, input=asks(shot(2)), max_output_tokens=5) as stream:
        async for event in stream:
            kinds.append(event.type)
            numbers.append(event.sequence_number)
            if event.type == "response.output_text.delta":
                deltas += event.delta
        final = await stream.get_final_response()
    assert numbers == list(range(len(kinds)))
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *["response.output_text.delta"] * 5, "response.output_text.done",
                     "response.content_part.done", "response.output_item.done", "response.completed"]
    assert final.output_text == deltas and final.usage is not None and final.usage.output_tokens == 5


async def test_a_cache_only_reference_is_a_processor_cache_hit(sim: SimServer, client: openai.AsyncOpenAI) -> None:
    """What mmgate sends for a repeat: ``image_url`` null and the uuid of an image sent before."""
    await client.responses.create(model=MODEL, input=asks(shot(3), uuid="shot-3"), max_output_tokens=1)  # type: ignore[arg-type]
    hits = sim.stats.cache_hits
    status, body = await post(sim, "/v1/responses", {"model": MODEL, "max_output_tokens": 1,
                                                     "input": asks(None, uuid="shot-3")})
    assert status == 200 and body["status"] == "incomplete", body
    assert sim.stats.cache_hits == hits + 1
    status, body = await post(sim, "/v1/responses", {"model": MODEL, "input": asks(None, uuid="never-sent")})
    assert status == 400, body


async def test_a_conversation_of_messages_function_calls_and_tools_is_read(client: openai.AsyncOpenAI) -> None:
    items = [*asks(shot(4)),
             {"type": "function_call", "call_id": "c1", "name": "click", "arguments": "{\"x\": 1}"},
             {"type": "function_call_output", "call_id": "c1", "output": "clicked"},
             {"role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
             {"type": "reasoning", "id": "rs_1", "summary": []},
             {"role": "developer", "content": "Be brief."}, {"role": "user", "content": "And now?"}]
    tools = [{"type": "function", "name": "click", "parameters": {"type": "object", "properties": {}}}]
    answer = await client.responses.create(model=MODEL, input=items, max_output_tokens=2, tools=tools)  # type: ignore[arg-type]
    assert answer.output_text and answer.usage is not None and answer.usage.output_tokens == 2
    assert answer.tool_choice == "auto" and [t.name for t in answer.tools] == ["click"]  # type: ignore[union-attr]


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"input": "x", "previous_response_id": "resp_1"}, 404, "response_id"),
    ({"input": "x", "background": True}, 400, "background"),
    ({"input": "x", "background": True, "store": False}, 400, "background"),
    ({"input": "x", "request_id": 5}, 400, "request_id"),
    ({"input": 7}, 400, "input"),
    ({"input": [{"type": "computer_call", "call_id": "c"}]}, 400, "input[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, 400, "input[0].content[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, 400, None),
    # Fields of the wrong type: each a 400 naming it (temperature and top_p were a 500).
    ({"input": "x", "temperature": "hot"}, 400, "temperature"),
    ({"input": "x", "top_p": [1]}, 400, "top_p"),
    ({"input": "x", "temperature": True}, 400, "temperature"),
    ({"input": "x", "stream": "yes"}, 400, "stream"),
    ({"input": "x", "instructions": 5}, 400, "instructions"),
    ({"input": "x", "tools": "t"}, 400, "tools"),
    ({"input": [{"role": "user", "content": None}]}, 400, "input[0].content"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, 400, "input[0].arguments"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": {"x": 1}}]}, 400, "input[0].output"),
])
async def test_what_it_cannot_serve_is_vllms_error(sim: SimServer, body: dict[str, Any], status: int,
                                                   param: str | None) -> None:
    answer, error = await post(sim, "/v1/responses", {"model": MODEL, **body})
    assert answer == status and error["error"]["code"] == status, error
    assert error["error"]["type"] == "invalid_request_error"
    if param is not None:
        assert error["error"]["param"] == param


async def test_no_response_is_stored(sim: SimServer, client: openai.AsyncOpenAI) -> None:
    made = await client.responses.create(model=MODEL, input="hello", max_output_tokens=1)
    for method, path in (("GET", f"/v1/responses/{made.id}"), ("POST", f"/v1/responses/{made.id}/cancel")):
        async with aiohttp.ClientSession() as http, http.request(method, sim.url + path) as resp:
            assert resp.status == 404 and (await resp.json())["error"]["param"] == "response_id"


async def test_a_response_in_flight_counts_in_the_server_load(make_sim: Any) -> None:
    """vLLM's ``load_aware_call`` counts Responses requests as it counts chat ones."""
    sim = await make_sim(enable_server_load_tracking=True, speedup=1.0, decode_ms_per_token=100.0)
    async with aiohttp.ClientSession() as http:
        streaming = http.post(sim.url + "/v1/responses", json={"model": MODEL, "input": "hi", "stream": True,
                                                                "max_output_tokens": 8})
        async with streaming as resp:
            await resp.content.readline()  # the stream has begun
            async with http.get(sim.url + "/load") as load:
                assert (await load.json()) == {"server_load": 1}
            await resp.read()
        async with http.get(sim.url + "/load") as load:
            assert (await load.json()) == {"server_load": 0}
