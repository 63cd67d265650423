"""A chat-completions SSE stream mapped to Anthropic's stream events, as vLLM 0.32's
``message_stream_converter`` maps it (``vllm/entrypoints/anthropic/serving.py``): the same events,
in the same order, with the same fields (its ``exclude_unset`` dumps). ``StreamMapper.feed(data)``
takes one chat ``data:`` payload and returns the SSE bytes to send. Pure logic: no I/O.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import orjson

from mmgate.anthropic_chat.reply import anthropic_usage, stop_reason


def event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


class StreamMapper:
    """The converter's state: the open content block, the tool calls seen, the stop reason."""

    def __init__(self) -> None:
        self.first = True
        self.finish_reason: str | None = None
        self.stop: int | str | None = None
        self.tool_used = False
        self.last_tool_args: list[str] = []
        self.tool_ids: dict[int, str] = {}
        self.next_index = 0
        self.block_type: str | None = None
        self.block_index: int | None = None
        self.signature: str | None = None
        self.signature_sent = False
        self.tool_use_id: str | None = None
        self.pending: list[str] = []
        self.done = False

    def feed(self, data: str) -> bytes:
        """The events for one chat ``data:`` payload (``[DONE]`` included)."""
        if data == "[DONE]":
            self.done = True
            return self._stop_and_flush() + event("message_stop", {"type": "message_stop"})
        try:
            chunk = orjson.loads(data)
            if not isinstance(chunk, dict) or "error" in chunk:
                raise ValueError(chunk.get("error") if isinstance(chunk, dict) else "not an object")
            return self._chunk(chunk)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            self.done = True
            return event("error", {"type": "error", "error": {"type": "internal_error", "message": str(exc)}})

    def _chunk(self, chunk: dict[str, Any]) -> bytes:
        if self.first:
            self.first = False
            message = {"id": chunk["id"], "type": "message", "role": "assistant", "content": [],
                       "model": chunk["model"], "stop_reason": None, "stop_sequence": None,
                       "usage": anthropic_usage(chunk.get("usage"))}
            return event("message_start", {"type": "message_start", "message": message})
        choices = chunk.get("choices") or []
        if not choices:
            out = self._stop_and_flush()
            reason, sequence = stop_reason(
                self.finish_reason or "stop", self.stop, tool_used=self.tool_used,
                tool_complete=self.tool_used and _is_json("".join(self.last_tool_args)),
            )
            delta = {"stop_reason": reason, "stop_sequence": sequence}
            return out + event("message_delta", {"type": "message_delta", "delta": delta,
                                                 "usage": anthropic_usage(chunk.get("usage"))})
        choice = choices[0]
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]
            self.stop = choice.get("stop_reason")
        delta = choice.get("delta") or {}
        out = b""
        reasoning = delta.get("reasoning")
        if reasoning:
            if self.block_type != "thinking":
                out += self._stop_and_flush() + self._start({"type": "thinking", "thinking": ""})
            out += self._delta({"type": "thinking_delta", "thinking": reasoning})
        text = delta.get("content")
        if text:
            if self.block_type == "tool_use":
                self.pending.append(text)
            else:
                if self.block_type != "text":
                    out += self._stop_and_flush() + self._start({"type": "text", "text": ""})
                out += self._delta({"type": "text_delta", "text": text})
        for call in delta.get("tool_calls") or []:
            if isinstance(call, dict):
                out += self._tool_call(call)
        return out

    def _tool_call(self, call: dict[str, Any]) -> bytes:
        out = b""
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if call.get("id") is not None:
            self.tool_ids[call.get("index", 0)] = call["id"]
            name = function.get("name")
            if self.tool_use_id != call["id"] and name is not None:
                out += self._stop_and_flush()
                self.tool_used = True
                self.last_tool_args = []
                out += self._start({"type": "tool_use", "id": call["id"], "name": name, "input": {}})
            if arguments and self.tool_use_id == call["id"]:
                self.last_tool_args.append(arguments)
                out += self._delta({"type": "input_json_delta", "partial_json": arguments})
        else:
            known = self.tool_ids.get(call.get("index", 0))
            if known is not None and arguments and self.tool_use_id == known:
                self.last_tool_args.append(arguments)
                out += self._delta({"type": "input_json_delta", "partial_json": arguments})
        return out

    def _index(self) -> int:
        return self.block_index if self.block_index is not None else self.next_index

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event("content_block_delta", {"type": "content_block_delta", "delta": delta, "index": self._index()})

    def _start(self, block: dict[str, Any]) -> bytes:
        out = event("content_block_start", {"type": "content_block_start", "content_block": block,
                                            "index": self.next_index})
        self.block_type = block["type"]
        self.block_index = self.next_index
        self.signature = uuid.uuid4().hex if block["type"] == "thinking" else None
        self.signature_sent = block["type"] != "thinking"
        self.tool_use_id = block.get("id") if block["type"] == "tool_use" else None
        return out

    def _stop_block(self) -> bytes:
        if self.block_type is None:
            return b""
        out = b""
        if self.block_type == "thinking" and self.signature is not None and not self.signature_sent:
            out += event("content_block_delta", {"type": "content_block_delta",
                                                 "delta": {"type": "signature_delta", "signature": self.signature},
                                                 "index": self.block_index})
        out += event("content_block_stop", {"type": "content_block_stop", "index": self.block_index})
        self.block_type = self.block_index = self.signature = self.tool_use_id = None
        self.signature_sent = False
        self.pending.clear()
        self.next_index += 1
        return out

    def _stop_and_flush(self) -> bytes:
        buffered = "".join(self.pending)
        self.pending.clear()
        out = self._stop_block()
        if not buffered:
            return out
        out += self._start({"type": "text", "text": ""})
        out += self._delta({"type": "text_delta", "text": buffered})
        return out + self._stop_block()
