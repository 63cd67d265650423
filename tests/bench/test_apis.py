"""The bench's three client APIs (pure): request shapes, whole replies and SSE streams."""

from __future__ import annotations

import orjson
import pytest

from mmgate._settings import ConfigError, build
from mmgate.bench.apis import MESSAGES_DEFAULT_MAX_TOKENS, whole_reply
from mmgate.bench.dataset import ImageEntry, Turn
from mmgate.bench.errors import BenchError
from mmgate.bench.payload import BodyOptions, api_body
from mmgate.bench.planner import PlannedImage
from mmgate.bench.settings import BenchSettings
from mmgate.bench.streams import MessagesSSE, ResponsesSSE

PNG = "data:image/png;base64,iVBORw0KGgo="


def turn(text: str, n_images: int) -> Turn:
    return Turn(texts=(text,), images=tuple(ImageEntry(f"/img{i}.png", None) for i in range(n_images)))


def sse(event: dict[str, object], name: str | None = None) -> bytes:
    head = f"event: {name}\n".encode() if name else b""
    return head + b"data: " + orjson.dumps(event) + b"\n\n"


def test_messages_body_lays_out_history_images_and_system() -> None:
    first, second = turn("what is this?", 1), turn("and now?", 1)
    plan = [PlannedImage(PNG, None), PlannedImage("http://127.0.0.1:9/b.png", None)]
    options = BodyOptions("m", stream=True, api="messages")
    body = api_body(options, "be brief", [(first, "a cat")], second, plan)
    assert body["system"] == "be brief" and body["max_tokens"] == MESSAGES_DEFAULT_MAX_TOKENS
    user1, assistant, user2 = body["messages"]
    assert user1["content"][0] == {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                 "data": "iVBORw0KGgo="}}
    assert user1["content"][1] == {"type": "text", "text": "what is this?"}
    assert assistant == {"role": "assistant", "content": "a cat"}
    assert user2["content"][0]["source"] == {"type": "url", "url": "http://127.0.0.1:9/b.png"}
    assert "stream_options" not in body


def test_responses_body_uses_input_items_and_max_output_tokens() -> None:
    options = BodyOptions("m", stream=False, output_length=7, api="responses", extra_body={"temperature": 0})
    body = api_body(options, "sys", [], turn("hi", 1), [PlannedImage(PNG, None)])
    assert body["instructions"] == "sys" and body["max_output_tokens"] == 7 and body["temperature"] == 0
    (item,) = body["input"]
    assert item["content"] == [{"type": "input_text", "text": "hi"},
                               {"type": "input_image", "image_url": PNG, "detail": "auto"}]


def test_a_cache_only_reference_cannot_be_written_in_messages_but_in_responses() -> None:
    with pytest.raises(BenchError, match="cache-only"):
        api_body(BodyOptions("m", api="messages"), None, [], turn("x", 1), [PlannedImage(None, "u1")])
    body = api_body(BodyOptions("m", api="responses"), None, [], turn("x", 2),
                    [PlannedImage(PNG, "u0"), PlannedImage(None, "u1")])
    assert body["input"][0]["content"][1:] == [
        {"type": "input_image", "image_url": PNG, "detail": "auto", "uuid": "u0"},
        {"type": "input_image", "image_url": None, "detail": "auto", "uuid": "u1"}]


def test_uuid_and_strip_needs_an_api_with_uuids() -> None:
    with pytest.raises(ConfigError, match="--uuid-and-strip"):
        build(BenchSettings, dataset="d.jsonl", api="messages", uuid_and_strip=True)
    assert build(BenchSettings, dataset="d.jsonl", api="responses", uuid_and_strip=True).uuid_and_strip


def test_whole_replies() -> None:
    message = {"content": [{"type": "text", "text": "Hel"}, {"type": "tool_use", "id": "t"},
                           {"type": "text", "text": "lo"}], "usage": {"output_tokens": 3}}
    assert whole_reply("messages", message) == ("Hello", 3)
    response = {"output": [{"type": "reasoning"}, {"type": "message", "content": [
        {"type": "output_text", "text": "ok"}]}], "usage": {"output_tokens": 1}}
    assert whole_reply("responses", response) == ("ok", 1)
    with pytest.raises(KeyError):
        whole_reply("messages", {"usage": {}})


def test_messages_stream_timing_usage_and_stop() -> None:
    state = MessagesSSE(collect=True)
    stream = (sse({"type": "message_start", "message": {"usage": {"input_tokens": 5}}}, "message_start")
              + sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
              + sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}})
              + b"event: ping\ndata: {\"type\": \"ping\"}\n\n"
              + sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "!"}}))
    state.feed(stream[:40], 10)
    assert state.first_token_ns == -1
    state.feed(stream[40:], 20)
    state.feed(sse({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}})
               + sse({"type": "message_stop"}) + sse({"type": "content_block_delta",
                                                      "delta": {"type": "text_delta", "text": "late"}}), 30)
    assert (state.first_token_ns, state.content_chunks, state.usage_tokens, state.done) == (20, 2, 2, True)
    assert "".join(state.pieces) == "Hi!" and state.error is None
    bad = MessagesSSE()
    bad.feed(sse({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}), 1)
    assert bad.error == "stream error: busy" and bad.done


def test_responses_stream_timing_usage_and_failure() -> None:
    state = ResponsesSSE(collect=True)
    state.feed(sse({"type": "response.created", "response": {}})
               + sse({"type": "response.output_text.delta", "delta": "a"}), 5)
    state.feed(sse({"type": "response.output_text.delta", "delta": "b"})
               + sse({"type": "response.completed", "response": {"usage": {"output_tokens": 9}}}), 6)
    assert (state.first_token_ns, state.content_chunks, state.usage_tokens, state.done) == (5, 2, 9, True)
    assert "".join(state.pieces) == "ab"
    failed = ResponsesSSE()
    failed.feed(sse({"type": "response.failed", "response": {"error": {"message": "x"}}}), 1)
    assert failed.done and failed.error is not None
