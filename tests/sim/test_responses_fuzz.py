"""Fuzz the sim's response store, tool checks and Messages API with garbage, sent for real over loopback: mutated
Responses requests (continuations, background, streams, request ids, tools), mutated chat requests
with tools, and junk ids and query strings on ``GET``/``cancel``. Every answer is a 2xx or a 4xx —
never a 5xx, never a crash — the store stays within its budget, and afterwards the engine still
stores and continues a conversation."""

from __future__ import annotations

import json
import random
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson

from mmgate._settings import MiB
from tests.support.fuzz import JUNK, mutate

MODEL = "mmgate-sim-vl"
SEED = 20261206
FN = {"type": "function", "name": "click", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}


def responses_request(previous: str) -> dict[str, Any]:
    return {"model": MODEL, "max_output_tokens": 2, "instructions": "be brief", "previous_response_id": previous,
            "request_id": "resp_fuzz", "store": True, "background": False, "stream": False, "metadata": {"k": "v"},
            "tools": [FN], "tool_choice": "none", "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "look"}]},
                {"type": "function_call", "call_id": "c1", "name": "click", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "ok"}]}


def chat_request() -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "look"}],
            "stop": ["\n", "e"], "min_tokens": 1, "thinking_token_budget": 1024,
            "tools": [{"type": "function", "function": {"name": "click", "parameters": {}}}],
            "tool_choice": {"type": "function", "function": {"name": "click"}}}


async def test_the_store_and_the_tool_checks_survive_garbage(make_sim: Any) -> None:
    rng = random.Random(SEED)
    sim = await make_sim(responses_store_bytes=MiB, enable_auto_tool_choice=True, tool_call_parser="hermes",
                         reasoning_parser="qwen3")
    statuses: dict[int, int] = {}
    async with aiohttp.ClientSession() as http:
        async with http.post(sim.url + "/v1/responses", json={"model": MODEL, "input": "seed",
                                                                "request_id": "resp_seed"}) as r:
            assert r.status == 200
        sends = [("/v1/responses", mutate(rng, responses_request("resp_seed"))) for _ in range(400)]
        sends += [("/v1/chat/completions", mutate(rng, chat_request())) for _ in range(300)]
        for path, raw in sends:
            async with http.post(sim.url + path, data=raw, headers={"Content-Type": "application/json"}) as r:
                text = await r.read()
                statuses[r.status] = statuses.get(r.status, 0) + 1
                assert r.status < 500, (path, r.status, raw[:300], text[:300])
        for junk in [*JUNK, "resp_seed", "resp_fuzz", "%00", "a" * 5000]:
            name = quote(str(junk), safe="", errors="surrogatepass")
            for method, tail in (("GET", ""), ("GET", f"?stream=true&starting_after={name}"),
                                 ("GET", f"?stream={name}"), ("POST", "/cancel")):
                async with http.request(method, f"{sim.url}/v1/responses/{name}{tail}") as r:
                    await r.read()
                    assert r.status < 500, (method, junk, tail, r.status)
        assert statuses.get(400, 0) > 100 and statuses.get(200, 0) > 100  # garbage, and some of it served
        stored = sim.engine.stored
        assert stored is not None and stored.bytes_used <= stored.max_bytes
        async with http.post(sim.url + "/v1/responses", json={"model": MODEL, "input": "more",
                                                                "previous_response_id": "resp_seed"}) as r:
            assert r.status == 200, await r.text()


def messages_request() -> dict[str, Any]:
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    return {"model": MODEL, "max_tokens": 1100, "system": [{"type": "text", "text": "be brief"}], "stream": False,
            "stop_sequences": ["\n"], "temperature": 0.5, "top_k": 3,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "tools": [{"name": "click", "input_schema": {"type": "object", "properties": {}}}],
            "tool_choice": {"type": "none"}, "messages": [
                {"role": "user", "content": [{"type": "text", "text": "look"},
                                             {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                          "data": png}}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "click", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}]}


async def test_the_messages_api_survives_garbage(make_sim: Any) -> None:
    """Mutated Messages requests, to be answered and counted (and what pydantic's lax reading must
    not trip on: digits past Python's limit, digits that are not decimal), get a 2xx or a 4xx in one
    of vLLM's two shapes."""
    rng = random.Random(SEED + 1)
    sim = await make_sim(reasoning_parser="qwen3")
    sends = [mutate(rng, messages_request()) for _ in range(500)]
    for odd in ("9" * 5000, "²", "+-1", 7, 2**70, 1e300):
        for where in ("max_tokens", "stream", "temperature"):
            sends.append(json.dumps({**messages_request(), where: odd}).encode())
        sends.append(json.dumps({**messages_request(), "max_tokens": 2048,
                                 "thinking": {"type": "enabled", "budget_tokens": odd}}).encode())
    statuses: dict[int, int] = {}
    async with aiohttp.ClientSession() as http:
        for raw, path in ((raw, path) for raw in sends for path in ("/v1/messages", "/v1/messages/count_tokens")):
            async with http.post(sim.url + path, data=raw, headers={"Content-Type": "application/json"}) as r:
                text = await r.read()
                statuses[r.status] = statuses.get(r.status, 0) + 1
                assert r.status < 500, (path, r.status, raw[:300], text[:300])
                if r.status >= 400:
                    body = orjson.loads(text)
                    assert (body["error"]["type"] if body.get("type") == "error" else body["error"]["message"]), body
    assert statuses.get(400, 0) > 100 and statuses.get(200, 0) > 50, statuses
