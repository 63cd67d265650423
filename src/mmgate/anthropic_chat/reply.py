"""A chat completion mapped back to an Anthropic message, as vLLM 0.32 maps it
(``vllm/entrypoints/anthropic/serving.py``: ``messages_full_converter``, ``_build_anthropic_usage``,
``_to_anthropic_stop_reason``). Pure logic: no I/O.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from mmgate.errors import InvalidRequestError


def anthropic_usage(usage: dict[str, Any] | None) -> dict[str, int]:
    """vLLM's ``_build_anthropic_usage``: input tokens net of cached ones, cache fields when known."""
    if usage is None:
        return {"input_tokens": 0, "output_tokens": 0}
    out: dict[str, int] = {}
    input_tokens = usage.get("prompt_tokens") or 0
    output = usage.get("completion_tokens") or 0
    cache: dict[str, int] = {}
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict):
        if (read := details.get("cached_tokens")) is not None:
            input_tokens -= read
            cache["cache_read_input_tokens"] = read
        if (created := details.get("created_cache_tokens")) is not None:
            input_tokens -= created
            cache["cache_creation_input_tokens"] = created
    out["input_tokens"] = max(0, input_tokens)
    out["output_tokens"] = output
    # The model's field order: creation before read.
    for name in ("cache_creation_input_tokens", "cache_read_input_tokens"):
        if name in cache:
            out[name] = cache[name]
    return out


def stop_reason(
    finish_reason: str | None, stop: int | str | None, *, tool_used: bool, tool_complete: bool
) -> tuple[str | None, str | None]:
    """vLLM's ``_to_anthropic_stop_reason``: (stop_reason, stop_sequence)."""
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason not in ("stop", "tool_calls"):
        return None, None
    if tool_complete:
        return "tool_use", None
    if isinstance(stop, str):
        return "stop_sequence", stop
    if finish_reason == "tool_calls" or tool_used:
        return "tool_use", None
    return "end_turn", None


def message_from_chat(chat: dict[str, Any]) -> dict[str, Any]:
    """The Anthropic message for a whole chat completion (``exclude_none`` as vLLM dumps it)."""
    choice = chat["choices"][0]
    message = choice.get("message") or {}
    calls = message.get("tool_calls") or []
    reason, sequence = stop_reason(choice.get("finish_reason"), choice.get("stop_reason"),
                                   tool_used=bool(calls), tool_complete=bool(calls))
    content: list[dict[str, Any]] = []
    if message.get("reasoning"):
        content.append({"type": "thinking", "thinking": message["reasoning"], "signature": uuid.uuid4().hex})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in calls:
        function = call.get("function") or {}
        content.append({"type": "tool_use", "id": call.get("id"), "name": function.get("name"),
                        "input": _tool_input(function.get("arguments"), f"content[{len(content)}].input")})
    if not content:
        content.append({"type": "text", "text": ""})
    out: dict[str, Any] = {"id": chat.get("id"), "type": "message", "role": "assistant", "content": content,
                           "model": chat.get("model")}
    if reason is not None:
        out["stop_reason"] = reason
    if sequence is not None:
        out["stop_sequence"] = sequence
    out["usage"] = anthropic_usage(chat.get("usage"))
    for name in ("kv_transfer_params", "ec_transfer_params"):
        if chat.get(name) is not None:
            out[name] = chat[name]
    return out


def _tool_input(arguments: Any, param: str) -> dict[str, Any]:
    """A generated tool call's arguments as the ``tool_use`` block's ``input``: vLLM's own endpoint
    answers 400 when they are not a JSON object (its ``AnthropicContentBlock`` refuses them), and so
    does the gateway, naming the block, rather than hand the SDK an ``input`` of another type."""
    try:
        value = json.loads(arguments or "{}")
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"the model's tool call arguments are not JSON: {exc}", param=param) from exc
    if not isinstance(value, dict):
        raise InvalidRequestError(
            f"the model's tool call arguments decode to {type(value).__name__}, not the object a tool_use "
            "'input' must be", param=param)
    return value
