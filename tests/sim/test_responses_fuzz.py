"""Fuzz the sim's response store and tool checks with garbage, sent for real over loopback: mutated
Responses requests (continuations, background, streams, request ids, tools), mutated chat requests
with tools, and junk ids and query strings on ``GET``/``cancel``. Every answer is a 2xx or a 4xx —
never a 5xx, never a crash — the store stays within its budget, and afterwards the engine still
stores and continues a conversation."""

from __future__ import annotations

import random
from typing import Any
from urllib.parse import quote

import aiohttp

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
            "tools": [{"type": "function", "function": {"name": "click", "parameters": {}}}],
            "tool_choice": {"type": "function", "function": {"name": "click"}}}


async def test_the_store_and_the_tool_checks_survive_garbage(make_sim: Any) -> None:
    rng = random.Random(SEED)
    sim = await make_sim(responses_store_bytes=MiB, enable_auto_tool_choice=True, tool_call_parser="hermes")
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
