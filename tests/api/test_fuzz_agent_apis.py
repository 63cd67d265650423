"""Fuzz the gateway's Responses and Anthropic Messages endpoints with garbage, sent for real over
loopback to a gateway in front of its embedded engines (a store and a tool parser, as ``make run``):
random mutations of a valid multimodal request of each API (image parts, uuids, tools, tool
results, continuations) and raw junk bytes. Every answer is a 2xx or a 4xx in the API's own error
shape — never a 5xx, never a crash — and afterwards the gateway still serves the valid requests."""

from __future__ import annotations

import base64
import random
from typing import Any

import aiohttp
import orjson

from tests.support.fuzz import mutate
from tests.support.gateway import running_gateway
from tests.support.images import make_image, png_data_url

MODEL = "mmgate-sim-vl"
SEED = 20261207


def responses_request() -> dict[str, Any]:
    return {"model": MODEL, "max_output_tokens": 2, "instructions": "be brief", "stream": False,
            "tools": [{"type": "function", "name": "click", "parameters": {"type": "object", "properties": {}}}],
            "input": [
                {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "look"},
                    {"type": "input_image", "image_url": png_data_url(11, 40, 30), "detail": "auto"},
                    {"type": "input_image", "image_url": png_data_url(12, 40, 30), "uuid": "fz-r"}]},
                {"type": "function_call", "call_id": "c1", "name": "click", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "ok"}]}


def messages_request() -> dict[str, Any]:
    png = base64.b64encode(make_image("PNG", 40, 30, seed=13)).decode()
    return {"model": MODEL, "max_tokens": 2, "system": "be brief", "stream": False,
            "tools": [{"name": "click", "input_schema": {"type": "object", "properties": {}}}],
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "click", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}]}]}]}


def error_message(path: str, answer: Any) -> str:
    """The error's message, from the API's own shape (Anthropic's ``{"type": "error", ...}``)."""
    if path == "/v1/messages":
        assert answer["type"] == "error", answer
    return str(answer["error"]["message"])


async def test_responses_and_messages_garbage_never_5xx() -> None:
    rng = random.Random(SEED)
    sends = [("/v1/responses", mutate(rng, responses_request())) for _ in range(500)]
    sends += [("/v1/messages", mutate(rng, messages_request())) for _ in range(500)]
    sends += [(path, rng.randbytes(rng.randint(0, 1000))) for path in ("/v1/responses", "/v1/messages")
              for _ in range(25)]
    statuses: dict[int, int] = {}
    async with running_gateway() as gw, aiohttp.ClientSession() as http:
        for path, raw in sends:
            async with http.post(gw.url + path, data=raw, headers={"Content-Type": "application/json"}) as r:
                text = await r.read()
                statuses[r.status] = statuses.get(r.status, 0) + 1
                assert r.status < 500, (path, r.status, raw[:300], text[:300])
                if r.status >= 400:
                    assert error_message(path, orjson.loads(text)), text
        assert statuses.get(400, 0) > 200 and statuses.get(200, 0) > 100  # garbage, and some of it served
        for path, body in (("/v1/responses", responses_request()), ("/v1/messages", messages_request())):
            async with http.post(gw.url + path, json=body) as r:
                assert r.status == 200, await r.text()
