"""Agents as their SDKs drive them, through the gateway to real vLLM: the official OpenAI Python
client (chat completions, Responses) and Anthropic's (Messages), each running the turns of an agent
that resends its whole history, screenshots included, with no uuid, streamed through each SDK's
stream helper (chat: its plain stream, as chat agents read it).

Each SDK parses the gateway's answers with its own models and stream accumulators (which check
the events' order and indexes as they merge them into the final message); every turn's repeats
reach vLLM as cache-only references (the gateway's ``mmgate_images_forwarded`` counts, read around
each turn: nothing else runs beside it); each turn's text is the one vLLM's own endpoint gives the
same SDK call with every screenshot sent (temperature 0, the replica that answered); bad input is
the SDK's own 400 exception, naming what was wrong."""

from __future__ import annotations

import base64
import itertools
from collections.abc import Awaitable
from typing import Any, TypeVar

import aiohttp
import anthropic
import openai
import pytest

from tests.support.images import data_url, make_image
from tests.support.serve_process import metric_value
from tests.support.vllm import SERVED_MODEL, GatewayProcess, VllmReplica

TURNS = 3
T = TypeVar("T")
_seeds = itertools.count(7000)


def screenshot() -> str:
    """A PNG data URL nobody has sent before (an agent's screenshot, small: 224x224)."""
    return data_url(make_image("PNG", 224, 224, seed=next(_seeds), noise=0.5), "image/png")


def payload(url: str) -> str:
    return url.split(",", 1)[1]


class Forwarded:
    """What the gateway sent its replicas between two reads of its /metrics: images with their
    bytes and stripped to a reference, and requests per replica."""

    def __init__(self, gateway: GatewayProcess, replicas: list[VllmReplica]) -> None:
        self.url = gateway.url + "/metrics"
        self.names = [f"vllm-{i}" for i in range(len(replicas))]
        self.replicas = replicas

    async def read(self) -> list[float]:
        async with aiohttp.ClientSession() as http, http.get(self.url) as resp:
            text = await resp.text()
        return [metric_value(text, "mmgate_images_forwarded_total", mode="data"),
                metric_value(text, "mmgate_images_forwarded_total", mode="stripped"),
                *(metric_value(text, "mmgate_backend_requests_total", backend=name, outcome="ok")
                  for name in self.names)]

    async def turn(self, turn: int, answer: Awaitable[T]) -> tuple[T, VllmReplica]:
        """``answer`` (a turn through the gateway), checked to have sent one screenshot with its
        bytes and stripped the ``turn`` earlier ones; and the one replica that answered it."""
        before = await self.read()
        got = await answer
        after = await self.read()
        answered = [r for r, a, b in zip(self.replicas, after[2:], before[2:], strict=True) if a > b]
        assert len(answered) == 1, (before, after)
        assert {"sent": after[0] - before[0], "stripped": after[1] - before[1]} == {"sent": 1, "stripped": turn}
        return got, answered[0]


def openai_client(url: str, session: str | None = None) -> openai.AsyncOpenAI:
    headers = {"x-session-id": session} if session else None
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=90,
                              default_headers=headers)


def anthropic_client(url: str, session: str | None = None) -> anthropic.AsyncAnthropic:
    headers = {"x-session-id": session} if session else None
    return anthropic.AsyncAnthropic(base_url=url, api_key="none", max_retries=0, timeout=90,
                                    default_headers=headers)


async def chat_turn(client: openai.AsyncOpenAI, messages: list[dict[str, Any]]) -> str:
    """One streamed turn as chat agents run it (``create(stream=True)``, usage included; the SDK's
    ``stream`` helper is for structured output and refuses a reply cut at ``max_tokens``): its text."""
    stream = await client.chat.completions.create(model=SERVED_MODEL, messages=messages, max_tokens=4,
                                                  temperature=0, stream=True, stream_options={"include_usage": True})
    text, usage, finish = "", None, None
    async for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
        usage = chunk.usage or usage
    assert finish in ("length", "stop")
    assert usage is not None and usage.completion_tokens > 0 and usage.prompt_tokens > 64
    return text


async def test_openai_chat_agent(gateway: GatewayProcess, vllm_replicas: list[VllmReplica]) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You operate a browser."}]
    forwarded = Forwarded(gateway, vllm_replicas)
    async with openai_client(gateway.url, "sdk-chat") as via:
        for turn in range(TURNS):
            messages.append({"role": "user", "content": [
                {"type": "text", "text": f"Step {turn}: what changed?"},
                {"type": "image_url", "image_url": {"url": screenshot(), "detail": "auto"}}]})
            text, replica = await forwarded.turn(turn, chat_turn(via, messages))
            async with openai_client(replica.url) as direct:
                assert await chat_turn(direct, messages) == text
            messages.append({"role": "assistant", "content": text})


async def responses_turn(client: openai.AsyncOpenAI, items: list[dict[str, Any]]) -> tuple[str, list[Any]]:
    """One streamed Responses turn through the SDK's stream helper: its final response's text and
    output items (which an agent appends to its next turn's input)."""
    deltas = ""
    async with client.responses.stream(model=SERVED_MODEL, input=items, max_output_tokens=4,
                                       temperature=0) as stream:
        async for event in stream:
            if event.type == "response.output_text.delta":
                deltas += event.delta
        final = await stream.get_final_response()
    # vLLM ends a turn cut at max_output_tokens with response.completed, its status incomplete.
    cut = final.incomplete_details.reason if final.incomplete_details else None
    assert final.status == "completed" or cut == "max_output_tokens", (final.status, cut)
    assert final.output_text == deltas and final.usage is not None and final.usage.input_tokens > 64
    return deltas, [item.model_dump(exclude_none=True) for item in final.output]


async def test_openai_responses_agent(gateway: GatewayProcess, vllm_replicas: list[VllmReplica]) -> None:
    items: list[dict[str, Any]] = []
    forwarded = Forwarded(gateway, vllm_replicas)
    async with openai_client(gateway.url, "sdk-responses") as via:
        for turn in range(TURNS):
            items.append({"role": "user", "content": [
                {"type": "input_text", "text": f"Step {turn}: what changed?"},
                {"type": "input_image", "image_url": screenshot(), "detail": "auto"}]})
            (text, output), replica = await forwarded.turn(turn, responses_turn(via, items))
            async with openai_client(replica.url) as direct:
                assert (await responses_turn(direct, items))[0] == text
            items += output


def shot_block(url: str) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": payload(url)}}


async def messages_turn(client: anthropic.AsyncAnthropic, messages: list[dict[str, Any]]) -> str:
    """One turn through the SDK's stream helper (as Claude-style agents run it): the accumulated
    final message's text, the same as the streamed text's."""
    async with client.messages.stream(model=SERVED_MODEL, max_tokens=4, messages=messages,
                                      system=[{"type": "text", "text": "You operate a browser.",
                                               "cache_control": {"type": "ephemeral"}}],
                                      cache_control={"type": "ephemeral"}, extra_body={"temperature": 0}) as stream:
        streamed = "".join([text async for text in stream.text_stream])
        final = await stream.get_final_message()
    assert final.role == "assistant" and final.stop_reason in ("max_tokens", "end_turn")
    assert final.usage.output_tokens > 0 and final.usage.input_tokens > 64
    text = "".join(block.text for block in final.content if block.type == "text")
    assert text == streamed
    return text


async def test_anthropic_messages_agent(gateway: GatewayProcess, vllm_replicas: list[VllmReplica]) -> None:
    """Tool results carrying the screenshots, the last block marked for prompt caching, as
    Claude-style agents send them."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Open the settings page."}]
    forwarded = Forwarded(gateway, vllm_replicas)
    async with anthropic_client(gateway.url, "sdk-messages") as via:
        for turn in range(TURNS):
            messages += [
                {"role": "assistant", "content": [{"type": "tool_use", "id": f"tu_{turn}", "name": "screenshot",
                                                   "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"tu_{turn}", "content": [
                    shot_block(screenshot()), {"type": "text", "text": f"step {turn}",
                                               "cache_control": {"type": "ephemeral"}}]}]}]
            text, replica = await forwarded.turn(turn, messages_turn(via, messages))
            async with anthropic_client(replica.url) as direct:
                assert await messages_turn(direct, messages) == text
            messages.append({"role": "assistant", "content": [{"type": "text", "text": text or "ok"}]})
            messages.append({"role": "user", "content": "Go on."})


NOT_AN_IMAGE = base64.b64encode(b"hello, not a picture").decode()


async def test_bad_image_is_each_sdks_400_naming_the_part(gateway: GatewayProcess) -> None:
    """A screenshot that is no image: the SDK raises its own BadRequestError, whose message (and,
    for OpenAI, ``param``) says which part it was; the gateway answers it, no replica."""
    bad = f"data:image/png;base64,{NOT_AN_IMAGE}"
    good = screenshot()
    async with openai_client(gateway.url) as client:
        with pytest.raises(openai.BadRequestError) as chat:
            await client.chat.completions.create(model=SERVED_MODEL, max_tokens=4, messages=[
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": good}},
                                             {"type": "image_url", "image_url": {"url": bad}}]}])
        assert chat.value.status_code == 400 and chat.value.param == "messages[0].content[1]"
        assert "x-mmgate-backend" not in chat.value.response.headers
        with pytest.raises(openai.BadRequestError) as responses:
            await client.responses.create(model=SERVED_MODEL, max_output_tokens=4, input=[{"role": "user", "content": [
                {"type": "input_image", "image_url": good, "detail": "auto"},
                {"type": "input_image", "image_url": bad, "detail": "auto"}]}])
        assert responses.value.status_code == 400 and responses.value.param == "input[0].content[1]"
        assert "x-mmgate-backend" not in responses.value.response.headers
    async with anthropic_client(gateway.url) as client:
        with pytest.raises(anthropic.BadRequestError) as messages:
            await client.messages.create(model=SERVED_MODEL, max_tokens=4, messages=[{"role": "user", "content": [
                shot_block(good), {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                               "data": NOT_AN_IMAGE}}]}])
        assert messages.value.status_code == 400
        assert messages.value.body["error"]["type"] == "invalid_request_error"
        assert "messages[0].content[1]" in messages.value.message
        assert "x-mmgate-backend" not in messages.value.response.headers
