"""Each error a client can meet answers with vLLM's status through the gateway, so the official SDK
raises the same exception class as against vLLM itself (openai: ``BadRequestError`` 400,
``NotFoundError`` 404, ``UnprocessableEntityError`` 422, ``InternalServerError`` 5xx), and the
answers keep vLLM's headers (``Vary: Origin``, an event stream's ``charset``).

Each case runs against a real replica directly and through a real ``mmgate serve``: the direct
answer is the reference, not a status written down here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import openai
import pytest

from tests.support.origin import ImageOrigin
from tests.support.vllm import SERVED_MODEL, GatewayProcess, VllmReplica
from tests.vllm.helpers import REQUEST_TIMEOUT, fresh_jpeg

UNDECODABLE = "data:image/png;base64,AAAA"


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=90)


def chat_with(part: dict[str, Any]) -> dict[str, Any]:
    return {"model": SERVED_MODEL, "max_tokens": 2,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "What is it?"}, part]}]}


async def sdk_error(url: str, call: Callable[[openai.AsyncOpenAI], Awaitable[Any]]) -> openai.APIStatusError:
    """The exception the openai SDK raises for ``call`` against ``url`` (fails if it succeeds)."""
    async with client(url) as sdk:
        with pytest.raises(openai.APIStatusError) as info:
            await call(sdk)
    return info.value


def chat_call(part: dict[str, Any]) -> Callable[[openai.AsyncOpenAI], Awaitable[Any]]:
    return lambda sdk: sdk.chat.completions.create(**chat_with(part))


async def same_class(
    gateway: GatewayProcess, replica: VllmReplica, call: Callable[[openai.AsyncOpenAI], Awaitable[Any]],
) -> tuple[openai.APIStatusError, openai.APIStatusError]:
    direct = await sdk_error(replica.url, call)
    through = await sdk_error(gateway.url, call)
    assert type(through) is type(direct), (direct.status_code, direct.message, through.status_code, through.message)
    return direct, through


async def test_an_undecodable_image_is_vllms_400(gateway: GatewayProcess, vllm_replicas: list[VllmReplica]) -> None:
    part = {"type": "image_url", "image_url": {"url": UNDECODABLE}}
    direct, through = await same_class(gateway, vllm_replicas[0], chat_call(part))
    assert isinstance(direct, openai.BadRequestError) and through.status_code == 400
    body = through.body
    assert isinstance(body, dict) and body["param"] == "messages[0].content[1]", body


async def test_an_image_url_answering_404_is_vllms_422(
    gateway: GatewayProcess, vllm_replicas: list[VllmReplica], origin: ImageOrigin,
) -> None:
    part = {"type": "image_url", "image_url": {"url": origin.url("/status/404")}}
    direct, through = await same_class(gateway, vllm_replicas[0], chat_call(part))
    assert isinstance(direct, openai.UnprocessableEntityError) and through.status_code == 422
    assert "404" in through.message


async def test_an_origin_failing_is_a_server_error_on_chat_and_tokenize(
    gateway: GatewayProcess, vllm_replicas: list[VllmReplica], origin: ImageOrigin,
) -> None:
    """vLLM answers 500 for an origin's 5xx (transient, retried by the SDKs). Through the gateway it
    is 502 on chat (the gateway fetched) and on /tokenize (vLLM fetched and answered 500): a
    backend's 500 is 502 on every endpoint, the gateway's "the server behind me failed"."""
    part = {"type": "image_url", "image_url": {"url": origin.url("/status/500")}}
    direct, through = await same_class(gateway, vllm_replicas[0], chat_call(part))
    assert isinstance(direct, openai.InternalServerError) and through.status_code == 502
    tokenize = {"model": SERVED_MODEL, "messages": chat_with(part)["messages"]}
    async with aiohttp.ClientSession(timeout=REQUEST_TIMEOUT) as http:
        async with http.post(vllm_replicas[0].url + "/tokenize", json=tokenize) as r:
            assert r.status == 500, await r.text()
        async with http.post(gateway.url + "/tokenize", json=tokenize) as r:
            assert r.status == 502, await r.text()


@pytest.mark.parametrize(
    ("part", "named"),
    [
        ({"type": "image_url", "image_url": "{png}"}, "must be an object"),
        ({"type": "input_image", "image_url": "{png}"}, "'detail'"),
        ({"type": "video_url", "video_url": "https://media.example/clip.mp4"}, "must be an object"),
    ],
    ids=["image_url-string", "input_image-no-detail", "video_url-string"],
)
async def test_shapes_vllm_refuses_are_refused_with_its_400(
    gateway: GatewayProcess, vllm_replicas: list[VllmReplica], part: dict[str, Any], named: str,
) -> None:
    png = fresh_jpeg(32)
    part = {k: (png if v == "{png}" else v) for k, v in part.items()}
    direct, through = await same_class(gateway, vllm_replicas[0], chat_call(part))
    assert isinstance(direct, openai.BadRequestError)
    assert named in through.message and isinstance(through.body, dict)
    assert through.body["param"] == "messages[0].content[1]"


async def test_an_input_image_without_detail_in_a_tool_output_is_vllms_400(
    gateway: GatewayProcess, vllm_replicas: list[VllmReplica],
) -> None:
    """In a Responses ``function_call_output`` the parts reach vLLM's chat parser as they are; in a
    message item vLLM fills the ``detail`` in, and both answer 200."""
    png = fresh_jpeg(32)

    def items(output_part: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"type": "function_call", "call_id": "c1", "name": "look", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": [output_part]}]

    bare = {"type": "input_image", "image_url": png}

    def call(sdk: openai.AsyncOpenAI) -> Awaitable[Any]:
        return sdk.responses.create(model=SERVED_MODEL, max_output_tokens=2, input=items(bare))  # type: ignore[arg-type]

    direct, through = await same_class(gateway, vllm_replicas[0], call)
    assert isinstance(direct, openai.BadRequestError) and "'detail'" in through.message
    assert isinstance(through.body, dict) and through.body["param"] == "input[1].output[0]"
    for url in (vllm_replicas[0].url, gateway.url):
        async with client(url) as sdk:
            with_detail = await sdk.responses.create(model=SERVED_MODEL, max_output_tokens=2,
                                                     input=items({**bare, "detail": "auto"}))  # type: ignore[arg-type]
            in_message = await sdk.responses.create(model=SERVED_MODEL, max_output_tokens=2, input=[
                {"role": "user", "content": [bare]}])  # type: ignore[list-item]
        assert with_detail.status in ("completed", "incomplete") and in_message.status in ("completed", "incomplete")


async def test_model_not_found_keeps_vllms_text(gateway: GatewayProcess, vllm_replicas: list[VllmReplica]) -> None:
    def call(sdk: openai.AsyncOpenAI) -> Awaitable[Any]:
        return sdk.chat.completions.create(**{**chat_with({"type": "text", "text": "x"}), "model": "no-such-model"})

    direct, through = await same_class(gateway, vllm_replicas[0], call)
    assert isinstance(direct, openai.NotFoundError)
    assert through.message == direct.message, (direct.message, through.message)


async def messages_status(url: str, source: dict[str, Any]) -> int:
    body = {"model": SERVED_MODEL, "max_tokens": 2,
            "messages": [{"role": "user", "content": [{"type": "image", "source": source}]}]}
    async with aiohttp.ClientSession(timeout=REQUEST_TIMEOUT) as http, \
            http.post(url + "/v1/messages", json=body) as r:
        return r.status


async def test_messages_images_fail_with_vllms_statuses(
    gateway: GatewayProcess, vllm_replicas: list[VllmReplica], origin: ImageOrigin,
) -> None:
    sources = [{"type": "base64", "media_type": "image/png", "data": "AAAA"},
               {"type": "url", "url": origin.url("/status/404")}]
    for source, status in zip(sources, (400, 422), strict=True):
        assert await messages_status(vllm_replicas[0].url, source) == status
        assert await messages_status(gateway.url, source) == status, source


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/messages", {"model": SERVED_MODEL, "max_tokens": 2, "stream": True,
                          "messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/responses", {"model": SERVED_MODEL, "max_output_tokens": 2, "stream": True, "input": "hi"}),
        ("/v1/chat/completions", {"model": SERVED_MODEL, "max_tokens": 2, "stream": True,
                                  "messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/chat/completions", {"model": SERVED_MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}),
    ],
    ids=["messages-stream", "responses-stream", "chat-stream", "chat"],
)
async def test_answers_keep_vllms_content_type_and_vary(
    gateway: GatewayProcess, vllm_replicas: list[VllmReplica], path: str, body: dict[str, Any],
) -> None:
    heads = []
    async with aiohttp.ClientSession(timeout=REQUEST_TIMEOUT) as http:
        for url in (vllm_replicas[0].url, gateway.url):
            async with http.post(url + path, json=body, headers={"Origin": "https://app.example"}) as r:
                await r.read()
                assert r.status == 200
                heads.append((r.headers.get("Content-Type"), r.headers.get("Vary")))
    assert heads[1] == heads[0], heads
