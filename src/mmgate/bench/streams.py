"""Incremental parsers of the three APIs' SSE streams (pure: bytes in, fields out).

Each reads ``data:`` lines as they arrive and keeps the fields a benchmark record needs:
``first_token_ns`` (the arrival of the first event carrying generated text or reasoning),
``content_chunks``, ``usage_tokens`` (the server's own output-token count), ``error`` (an error event
or a malformed one) and ``done``. The APIs differ only in their events:

* chat — ``choices[0].delta.content`` / ``reasoning_content``; ``usage.completion_tokens``; ``[DONE]``;
* responses — ``response.output_text.delta`` / ``response.reasoning_text.delta``;
  ``response.completed`` carries ``response.usage.output_tokens`` and ends the stream;
* messages (Anthropic) — ``content_block_delta`` with a ``text_delta`` / ``thinking_delta``;
  ``message_delta`` carries ``usage.output_tokens``; ``message_stop`` ends it.
"""

from __future__ import annotations

from typing import Any

import orjson

from mmgate.vllm_protocol import error_message


def _error_text(payload: bytes, event: dict[str, Any]) -> str:
    err = event.get("error")
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return str(err["message"])
    fallback = payload[:300].decode("utf-8", "replace").strip()
    return error_message(event, fallback)


class SSEState:
    """The OpenAI chat-completion stream (the base of the other APIs' parsers)."""

    __slots__ = ("collect", "content_chunks", "done", "error", "first_token_ns", "pieces", "tail",
                 "usage_tokens")

    def __init__(self, collect: bool = False) -> None:
        self.collect = collect
        self.tail = b""
        self.done = False
        self.error: str | None = None
        self.first_token_ns = -1
        self.content_chunks = 0
        self.usage_tokens: int | None = None
        self.pieces: list[str] = []

    def feed(self, chunk: bytes, now_ns: int) -> None:
        if self.done:
            return
        lines = (self.tail + chunk if self.tail else chunk).split(b"\n")
        self.tail = lines.pop()
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                return
            try:
                event = orjson.loads(payload)
            except orjson.JSONDecodeError:
                self._fail("malformed SSE event: " + payload[:200].decode("utf-8", "replace"))
                return
            if isinstance(event, dict):
                self.on_event(event, payload, now_ns)
            if self.done:
                return

    def on_event(self, event: dict[str, Any], payload: bytes, now_ns: int) -> None:
        if "error" in event:
            self._fail("stream error: " + _error_text(payload, event))
            return
        usage = event.get("usage")
        if usage and isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage_tokens = usage["completion_tokens"]
        choices: Any = event.get("choices")
        if not choices:
            return
        delta = choices[0].get("delta") or {}
        self.text(delta.get("content") or delta.get("reasoning_content"), now_ns)

    def text(self, text: Any, now_ns: int) -> None:
        """A piece of generated text (or reasoning) arrived at ``now_ns``."""
        if not text or not isinstance(text, str):
            return
        if self.first_token_ns < 0:
            self.first_token_ns = now_ns
        self.content_chunks += 1
        if self.collect:
            self.pieces.append(text)

    def _fail(self, message: str) -> None:
        self.error = message
        self.done = True


class ResponsesSSE(SSEState):
    """The OpenAI Responses stream."""

    __slots__ = ()

    def on_event(self, event: dict[str, Any], payload: bytes, now_ns: int) -> None:
        kind = event.get("type")
        if kind in ("response.output_text.delta", "response.reasoning_text.delta"):
            self.text(event.get("delta"), now_ns)
        elif kind in ("response.completed", "response.incomplete"):
            response = event.get("response")
            usage = response.get("usage") if isinstance(response, dict) else None
            if isinstance(usage, dict) and isinstance(usage.get("output_tokens"), int):
                self.usage_tokens = usage["output_tokens"]
            self.done = True
        elif kind in ("error", "response.failed") or ("error" in event and kind is None):
            self._fail("stream error: " + _error_text(payload, event))


class MessagesSSE(SSEState):
    """The Anthropic Messages stream."""

    __slots__ = ()

    def on_event(self, event: dict[str, Any], payload: bytes, now_ns: int) -> None:
        kind = event.get("type")
        if kind == "content_block_delta":
            delta = event.get("delta")
            if isinstance(delta, dict):
                self.text(delta.get("text") or delta.get("thinking"), now_ns)
        elif kind == "message_delta":
            usage = event.get("usage")
            if isinstance(usage, dict) and isinstance(usage.get("output_tokens"), int):
                self.usage_tokens = usage["output_tokens"]
        elif kind == "message_stop":
            self.done = True
        elif kind == "error" or ("error" in event and kind is None):
            self._fail("stream error: " + _error_text(payload, event))


STREAM_PARSERS: dict[str, type[SSEState]] = {"chat": SSEState, "responses": ResponsesSSE, "messages": MessagesSSE}
