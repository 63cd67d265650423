"""Attack shapes on the OpenAI surface that the other tests in this folder did not send, through a
real gateway in front of an echo backend that keeps the bytes it got (``tests.backends.echo_server``):
each is refused with a 400 naming the field, or reaches the backend policed, never a 500. Where
vLLM's reading is the question, vLLM 0.32's own code (the vLLM venv's interpreter) is the oracle.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson
import pytest
import yarl

from mmgate.config import BackendSpec
from mmgate.serve import RunningGateway
from tests.backends.echo_server import EchoBackend, echo_backend
from tests.conftest import located_vllm
from tests.support.gateway import gateway_settings, running_gateway
from tests.support.images import png_data_url

PRIVATE = "http://10.0.0.1/x.png"  # a private address the URL policy refuses
CHAT_IMAGE = {"type": "image_url", "image_url": {"url": PRIVATE}}
RESPONSES_IMAGE = {"type": "input_image", "image_url": PRIVATE, "detail": "auto"}


@asynccontextmanager
async def gateway() -> AsyncIterator[tuple[RunningGateway, EchoBackend]]:
    async with echo_backend("e0", ("m1",)) as echo, running_gateway(
            gateway_settings(backends=(BackendSpec(kind="vllm", url=echo.url, name="e0"),))) as gw:
        yield gw, echo


async def post(url: str, raw: bytes) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.post(url, data=raw, headers={"Content-Type": "application/json"}) as r:
        payload = await r.read()
        try:
            return r.status, orjson.loads(payload)
        except orjson.JSONDecodeError:
            return r.status, payload


def posted(echo: EchoBackend, path: str) -> list[bytes]:
    return [s.body for s in echo.seen if s.method == "POST" and s.path_qs.startswith(path)]


# Items vLLM 0.32 accepts as another type yet hands to its chat parser as a message: its Responses
# input is a union of TypedDicts (extra keys kept), and ``construct_input_messages`` returns any
# dict item with a ``role`` as a chat message, ``content`` and all.
ROLE_ITEMS = [
    {"type": "item_reference", "id": "x"},
    {"type": "apply_patch_call_output", "id": "x", "call_id": "c", "status": "completed"},
]


def test_vllm_renders_another_item_type_with_a_role_as_a_message() -> None:
    """The oracle: the premise of the next test holds for the vLLM the project runs."""
    items = [{**item, "role": "user", "content": [CHAT_IMAGE]} for item in ROLE_ITEMS]
    script = (
        "import json, sys\n"
        "from vllm.entrypoints.openai.responses.protocol import ResponsesRequest\n"
        "from vllm.entrypoints.openai.responses.utils import construct_input_messages\n"
        "out = []\n"
        "for item in json.loads(sys.argv[1]):\n"
        "    req = ResponsesRequest.model_validate({'model': 'm', 'input': [item]})\n"
        "    out.append(construct_input_messages(request_input=req.input))\n"
        "print('ORACLE' + json.dumps(out))\n"
    )
    done = subprocess.run([str(located_vllm().python), "-c", script, json.dumps(items)],
                          capture_output=True, text=True, timeout=240, check=True)
    line = next(x for x in done.stdout.splitlines() if x.startswith("ORACLE"))
    for messages in json.loads(line[len("ORACLE"):]):
        assert messages[0]["role"] == "user" and messages[0]["content"] == [CHAT_IMAGE], messages


@pytest.mark.parametrize("item", ROLE_ITEMS, ids=lambda item: item["type"])
@pytest.mark.parametrize("part", [CHAT_IMAGE, RESPONSES_IMAGE], ids=["image_url", "input_image"])
async def test_another_item_type_with_a_role_is_policed_as_a_message(item: dict[str, Any],
                                                                      part: dict[str, Any]) -> None:
    async with gateway() as (gw, echo):
        body = {"model": "m1", "input": [{**item, "role": "user", "content": [part]}]}
        status, reply = await post(gw.url + "/v1/responses", orjson.dumps(body))
        assert status == 400 and reply["error"]["param"] == "input[0].content[0]", reply
        assert not posted(echo, "/v1/responses")
        # An image the policy allows, in the same shape, goes through the pipeline (a data URL).
        body["input"][0]["content"] = [{"type": "input_image", "image_url": png_data_url(1), "detail": "auto"}]
        status, reply = await post(gw.url + "/v1/responses", orjson.dumps(body))
        assert status == 200, reply
        sent = orjson.loads(posted(echo, "/v1/responses")[-1])["input"][0]["content"][0]
        assert sent["type"] == "input_image" and sent["image_url"].startswith("data:image/png"), sent


@pytest.mark.parametrize("kind", [["message"], {"t": 1}, 5, True])
async def test_a_responses_item_type_that_is_no_string_is_a_400_not_a_500(kind: Any) -> None:
    async with gateway() as (gw, echo):
        raw = orjson.dumps({"model": "m1", "input": [{"type": kind, "role": "user", "content": "hi"}]})
        replies = await asyncio.gather(*(post(gw.url + "/v1/responses", raw) for _ in range(50)))
        for status, reply in replies:
            assert status == 400 and reply["error"]["param"] == "input[0].type", reply
        assert not posted(echo, "/v1/responses")
        status, reply = await post(gw.url + "/v1/responses", orjson.dumps({"model": "m1", "input": "hi"}))
        assert status == 200, reply


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize", "/v1/completions", "/v1/embeddings"])
async def test_a_duplicate_key_cannot_carry_an_unpoliced_url_to_the_backend(path: str) -> None:
    """JSON parsers disagree on duplicate keys (orjson and Python's keep the last, others the
    first): a body the gateway found no media in must not reach the backend with its bytes, a first
    ``messages`` holding a URL the policy never saw."""
    hidden = orjson.dumps([{"role": "user", "content": [CHAT_IMAGE]}])
    raw = b'{"model": "m1", "messages": ' + hidden + b', "messages": "hi"}'
    async with gateway() as (gw, echo):
        status, reply = await post(gw.url + path, raw)
        assert status == 200, reply
        (sent,) = posted(echo, path)
        assert PRIVATE.encode() not in sent and orjson.loads(sent)["messages"] == "hi", sent


@pytest.mark.parametrize("method, suffix", [("GET", ""), ("POST", "/cancel")])
async def test_a_stored_response_request_keeps_its_query_string_as_sent(method: str, suffix: str) -> None:
    """The query reaches the backend as the client encoded it: decoded first, an escaped ``#``
    ended it there (``stream`` after it was lost) and escaped CR/LF were dropped."""
    query = "starting_after=a%23b%0D%0Ac&stream=true&x=%26y%3Dz"
    async with gateway() as (gw, echo), aiohttp.ClientSession() as s:
        url = yarl.URL(f"{gw.url}/v1/responses/resp_1{suffix}?{query}", encoded=True)
        async with s.request(method, url) as r:
            assert r.status == 200, await r.text()
        assert echo.seen[-1].path_qs == f"/v1/responses/resp_1{suffix}?{query}"
