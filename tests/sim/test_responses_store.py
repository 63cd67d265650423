"""The sim's response store (``--responses-store-mb``), vLLM's with
``VLLM_ENABLE_RESPONSES_API_STORE=1``: a response kept under its ``request_id``, continued by
``previous_response_id`` with the conversation it was made of, run in the background, read back
(its stream too, from any event) and cancelled; bad ids and parameters refused naming the field; the
store bounded by bytes. Real engines on loopback, through raw HTTP and the openai SDK."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from mmgate._settings import MiB
from mmgate.sim.response_store import ENTRY_OVERHEAD_BYTES
from mmgate.sim.server import SimServer
from tests.support.agents import call as agents_call
from tests.support.gateway import FAST_SIM, running_gateway

MODEL = "mmgate-sim-vl"
STORE = {"responses_store_bytes": MiB}
# A background answer that takes 3 s: long enough to be seen running and cancelled.
SLOW = {**STORE, "speedup": 1.0, "decode_ms_per_token": 100.0}


async def call(sim: SimServer, path: str, body: Any = None, method: str = "POST") -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.request(method, sim.url + path, json=body) as resp:
        return resp.status, await resp.json()


async def events(sim: SimServer, path: str, body: Any = None, method: str = "POST") -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.request(method, sim.url + path, json=body) as resp:
        assert resp.status == 200 and resp.content_type == "text/event-stream"
        raw = await resp.read()
    return [orjson.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: ")]


def ask(text: str, **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": text, "max_output_tokens": 4, **fields}


def said(response: dict[str, Any]) -> str:
    return "".join(part["text"] for item in response["output"] for part in item["content"])


async def test_a_response_is_kept_under_its_request_id_and_continued(make_sim: Any) -> None:
    sim = await make_sim(**STORE)
    status, one = await call(sim, "/v1/responses", ask("What is on screen?", request_id="resp_one",
                                                       instructions="Be terse."))
    assert status == 200 and one["id"] == "resp_one" and one["previous_response_id"] is None
    assert await call(sim, "/v1/responses/resp_one", method="GET") == (200, one)
    # The continuation's prompt is the stored conversation, then the answer, then the new input
    # (the earlier instructions do not carry over): the same prompt as that history sent whole.
    status, two = await call(sim, "/v1/responses", ask("And then?", previous_response_id="resp_one"))
    assert status == 200 and two["previous_response_id"] == "resp_one" and two["id"] != "resp_one"
    history = [{"role": "user", "content": "What is on screen?"}, {"role": "assistant", "content": said(one)},
               {"role": "user", "content": "And then?"}]
    _, whole = await call(sim, "/v1/responses", {**ask(""), "input": history, "store": False})
    assert two["usage"]["input_tokens"] == whole["usage"]["input_tokens"] > one["usage"]["input_tokens"]
    assert said(two) == said(whole)  # the sim's text is seeded by its prompt
    # Two deep, with instructions of its own, through the openai SDK.
    async with openai.AsyncOpenAI(base_url=f"{sim.url}/v1", api_key="x", max_retries=0) as client:
        three = await client.responses.create(model=MODEL, input="Last?", previous_response_id=two["id"],
                                              instructions="Answer.", max_output_tokens=4)
        again = await client.responses.retrieve(three.id)
    assert again.output_text == three.output_text and three.previous_response_id == two["id"]
    history += [{"role": "assistant", "content": said(two)}, {"role": "user", "content": "Last?"}]
    _, whole = await call(sim, "/v1/responses", {**ask(""), "input": history, "instructions": "Answer.",
                                                 "store": False})
    assert three.usage is not None and three.usage.input_tokens == whole["usage"]["input_tokens"]


async def test_store_false_keeps_nothing_and_a_reused_id_is_replaced(make_sim: Any) -> None:
    sim = await make_sim(**STORE)
    status, _ = await call(sim, "/v1/responses", ask("hi", request_id="resp_gone", store=False))
    assert status == 200
    assert (await call(sim, "/v1/responses/resp_gone", method="GET"))[0] == 404
    _, first = await call(sim, "/v1/responses", ask("first", request_id="resp_same"))
    _, second = await call(sim, "/v1/responses", ask("second, longer", request_id="resp_same"))
    assert await call(sim, "/v1/responses/resp_same", method="GET") == (200, second) and second != first
    status, error = await call(sim, "/v1/responses", ask("x", previous_response_id="resp_gone"))
    assert status == 404 and error["error"]["param"] == "response_id" and "resp_gone" in error["error"]["message"]


@pytest.mark.parametrize(("body", "param"), [
    (ask("x", background=True, store=False), "background"),
    (ask("x", request_id=7), "request_id"),
    (ask("x", previous_response_id=["resp_one"]), "previous_response_id"),
    (ask("x", store="yes"), "store"),
])
async def test_bad_store_fields_are_a_400_naming_them(make_sim: Any, body: dict[str, Any], param: str) -> None:
    sim = await make_sim(**STORE)
    status, error = await call(sim, "/v1/responses", body)
    assert status == 400 and error["error"]["param"] == param, error
    assert len(sim.engine.stored) == 0


async def test_a_background_response_runs_on_and_is_cancelled(make_sim: Any) -> None:
    sim = await make_sim(**SLOW)
    status, queued = await call(sim, "/v1/responses", ask("long", background=True, max_output_tokens=30))
    assert status == 200 and queued["status"] == "queued" and queued["background"] is True and queued["output"] == []
    assert (await call(sim, f"/v1/responses/{queued['id']}", method="GET"))[1]["status"] == "queued"
    status, cancelled = await call(sim, f"/v1/responses/{queued['id']}/cancel")
    assert status == 200 and cancelled["status"] == "cancelled"
    assert (await call(sim, f"/v1/responses/{queued['id']}", method="GET"))[1]["status"] == "cancelled"
    status, error = await call(sim, f"/v1/responses/{queued['id']}/cancel")
    assert status == 400 and error["error"] == {"message": "Cannot cancel a synchronous response.",
                                                "type": "invalid_request_error", "param": "response_id", "code": 400}
    # A short one completes on its own; its answer replaces the queued response.
    _, short = await call(sim, "/v1/responses", ask("short", background=True, max_output_tokens=2))
    for _ in range(100):
        _, now = await call(sim, f"/v1/responses/{short['id']}", method="GET")
        if now["status"] != "queued":
            break
        await asyncio.sleep(0.05)
    assert now["status"] == "incomplete" and now["usage"]["output_tokens"] == 2 and said(now)
    assert (await call(sim, f"/v1/responses/{short['id']}/cancel"))[0] == 400
    assert (await call(sim, "/v1/responses/resp_never/cancel"))[0] == 404
    # One still running when the engine stops is cancelled with it.
    await call(sim, "/v1/responses", ask("left", background=True, max_output_tokens=30, request_id="resp_left"))
    left = sim.engine.stored.get("resp_left")
    await sim.stop()
    assert left is not None and left.task is not None and left.task.cancelled()


async def test_a_background_stream_is_read_again_from_any_event(make_sim: Any) -> None:
    sim = await make_sim(**STORE)
    first = await events(sim, "/v1/responses", ask("stream it", background=True, stream=True))
    kinds = [event["type"] for event in first]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert [event["sequence_number"] for event in first] == list(range(len(first)))
    response_id = first[-1]["response"]["id"]
    path = f"/v1/responses/{response_id}"
    assert await events(sim, path + "?stream=true&starting_after=3", method="GET") == first[4:]
    assert await events(sim, path + "?stream=1", method="GET") == first
    assert (await call(sim, path, method="GET"))[1] == first[-1]["response"]
    for query, param in (("?stream=maybe", "stream"), ("?stream=true&starting_after=x", "starting_after"),
                         ("?stream=true&starting_after=--5", "starting_after"),
                         ("?stream=true&starting_after=" + "9" * 5000, "starting_after")):
        status, error = await call(sim, path + query, method="GET")
        assert status == 400 and error["error"]["param"] == param
    _, plain = await call(sim, "/v1/responses", ask("not in the background"))
    status, error = await call(sim, f"/v1/responses/{plain['id']}?stream=true", method="GET")
    assert status == 400 and error["error"]["param"] == "response_id"


async def test_a_reader_waits_for_the_events_still_to_come(make_sim: Any) -> None:
    sim = await make_sim(**SLOW)
    reader = asyncio.create_task(events(sim, "/v1/responses", ask("slow", background=True, stream=True,
                                                                  request_id="resp_s", max_output_tokens=5)))
    await asyncio.sleep(0.2)
    late = await events(sim, "/v1/responses/resp_s?stream=true&starting_after=1", method="GET")
    first = await reader
    assert late == first[2:] and first[-1]["type"] == "response.completed"


async def test_the_store_is_bounded_by_bytes(make_sim: Any) -> None:
    budget = 8 * ENTRY_OVERHEAD_BYTES
    sim = await make_sim(responses_store_bytes=budget)
    for n in range(20):
        status, _ = await call(sim, "/v1/responses", ask("x" * 500, request_id=f"resp_{n}"))
        assert status == 200
    stored = sim.engine.stored
    assert 0 < len(stored) < 8 and stored.get("resp_19") is not None
    assert (await call(sim, "/v1/responses/resp_0", method="GET"))[0] == 404
    # A conversation counts its history: its links crowd the others out, and the one that outgrows
    # the whole budget is answered but not kept, so the conversation ends there.
    previous, steps = "resp_19", 0
    while (answer := await call(sim, "/v1/responses", ask("y" * 500, previous_response_id=previous)))[0] == 200:
        previous, steps = answer[1]["id"], steps + 1
        assert steps < 8
    assert answer[1]["error"]["param"] == "response_id" and stored.get(previous) is None and steps >= 2
    assert stored.bytes_used <= budget


async def test_without_a_store_a_request_id_still_names_the_response(make_sim: Any) -> None:
    sim = await make_sim()
    status, made = await call(sim, "/v1/responses", ask("hi", request_id="resp_named"))
    assert status == 200 and made["id"] == "resp_named"
    assert (await call(sim, "/v1/responses/resp_named", method="GET"))[0] == 404


async def test_a_stream_its_client_left_is_not_kept(make_sim: Any) -> None:
    """As vLLM stores a response once answered: a stream cut by its client leaves nothing."""
    sim = await make_sim(**SLOW)
    async with aiohttp.ClientSession() as http:
        async with http.post(sim.url + "/v1/responses", json=ask("cut", stream=True, max_output_tokens=30,
                                                                  request_id="resp_cut")) as resp:
            await resp.content.readline()  # the stream has begun; leave
    for _ in range(50):  # the engine sees the disconnect at its next write
        if sim.stats.requests:
            break
        await asyncio.sleep(0.1)
    assert sim.engine.stored is not None and sim.engine.stored.get("resp_cut") is None
    assert (await call(sim, "/v1/responses/resp_cut", method="GET"))[0] == 404


async def test_the_engines_mmgate_serve_embeds_keep_responses() -> None:
    """``make run``'s engines keep responses (as OpenAI's API does by default), unless told not to."""
    async with running_gateway() as gw:
        made = await agents_call(gw.url, "/v1/responses", ask("first"))
        follow = await agents_call(gw.url, "/v1/responses", ask("next", previous_response_id=made.json["id"]))
        assert made.status == follow.status == 200 and follow.json["previous_response_id"] == made.json["id"]
    async with running_gateway(sim=FAST_SIM.model_copy(update={"responses_store_bytes": 0})) as gw:
        made = await agents_call(gw.url, "/v1/responses", ask("first"))
        follow = await agents_call(gw.url, "/v1/responses", ask("next", previous_response_id=made.json["id"]))
        assert made.status == 200 and follow.status == 404
