"""The SSE stream parser (pure): TTFT on the first non-empty content, usage, [DONE], errors."""

from __future__ import annotations

import orjson

from mmgate.bench.client import SSEState, endpoint_urls


def event(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def delta(text: str, key: str = "content") -> bytes:
    return event({"choices": [{"index": 0, "delta": {key: text}}]})


def test_first_token_is_first_non_empty_content_even_split_across_chunks() -> None:
    state = SSEState(collect=True)
    stream = delta("") + b": keep-alive comment\n\n" + delta("Hel") + delta("lo", "reasoning_content")
    stream += event({"choices": [], "usage": {"completion_tokens": 7}}) + b"data: [DONE]\n\n" + delta("late")
    cut = stream.index(b"Hel") - 4  # the first content event arrives in two pieces
    state.feed(stream[:cut], 100)
    assert state.first_token_ns == -1
    state.feed(stream[cut:], 200)
    assert (state.first_token_ns, state.content_chunks, state.usage_tokens) == (200, 2, 7)
    assert state.done and state.error is None
    assert "".join(state.pieces) == "Hello"  # nothing after [DONE]


def test_error_event_and_garbage() -> None:
    state = SSEState()
    state.feed(delta("a") + event({"error": {"message": "boom", "code": 500}}), 5)
    assert state.error == "stream error: boom" and state.done
    bad = SSEState()
    bad.feed(b"data: {not json\n", 1)
    assert bad.error is not None and bad.error.startswith("malformed SSE event")
    tail = SSEState()
    tail.feed(delta("x")[:-2], 3)  # no newline yet: nothing parsed
    assert tail.content_chunks == 0
    tail.feed(b"\n", 4)
    assert (tail.content_chunks, tail.first_token_ns) == (1, 4)


def test_endpoint_urls() -> None:
    assert endpoint_urls("http://h:1/v1/") == ("http://h:1/v1/chat/completions", "http://h:1/v1/models")
    assert endpoint_urls("https://h") == ("https://h/v1/chat/completions", "https://h/v1/models")
