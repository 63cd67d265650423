"""A chat-completions reply mapped back to an Anthropic message, and errors in Anthropic's shape,
as vLLM 0.32 writes them (``vllm/entrypoints/anthropic/serving.py``: ``messages_full_converter``,
``_build_anthropic_usage``, ``_to_anthropic_stop_reason``; ``api_router.translate_error_response``).

Pure logic: no I/O.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import orjson

from mmgate.errors import BackendStatusError, EndpointNotFoundError, InvalidRequestError, MmgateError

# Anthropic's error types for the gateway's own errors, by status (a backend's error keeps the
# type vLLM gave it, as vLLM's own endpoint does).
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 408: "timeout_error", 413: "request_too_large", 415: "invalid_request_error",
                429: "rate_limit_error", 503: "overloaded_error"}


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


def error_body(exc: MmgateError) -> dict[str, Any]:
    """``{"type": "error", "error": {"type", "message"}}``: a backend's error keeps its own type."""
    if isinstance(exc, BackendStatusError) and exc.body is not None and isinstance(exc.body.get("error"), dict):
        inner = exc.body["error"]
        kind = inner.get("type") if isinstance(inner.get("type"), str) else "api_error"
        message = inner.get("message") if isinstance(inner.get("message"), str) else exc.message
        return {"type": "error", "error": {"type": kind, "message": message}}
    kind = _ERROR_TYPES.get(exc.status, "invalid_request_error" if exc.status < 500 else "api_error")
    # Anthropic's error has no 'param': the offending field is named in the message.
    message = exc.message if exc.param is None else f"{exc.message} (param: {exc.param})"
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_event(exc: MmgateError) -> bytes:
    """An SSE ``error`` event, for failures after a stream has started."""
    return b"event: error\ndata: " + orjson.dumps(error_body(exc)) + b"\n\n"


def relayed_error(status: int, body: bytes | None) -> bytes | None:
    """A backend's error answer to a forwarded request in Anthropic's shape, or None when it is
    already: vLLM's request validation answers /v1/messages in OpenAI's (``{"error": {...}}``, its
    FastAPI handler's, not its Anthropic router's), and a backend without the endpoint in plain text."""
    try:
        parsed = orjson.loads(body or b"null")
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict) and parsed.get("type") == "error" and isinstance(parsed.get("error"), dict):
        return None
    inner = parsed.get("error") if isinstance(parsed, dict) else None
    text = (body or b"")[:300].decode("utf-8", "replace").strip() or f"the backend answered HTTP {status}"
    kind = _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    if isinstance(inner, dict):
        kind = inner["type"] if isinstance(inner.get("type"), str) else kind
        text = inner["message"] if isinstance(inner.get("message"), str) else text
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": text}})


# Why a request was forwarded (``request.forward_reason``) → the field, and the shapes the gateway maps.
_MAPPED = {
    "thinking": ("thinking", "`thinking` is mapped onto chat as `enabled` with an integer `budget_tokens` of at "
                 "least 1024 below `max_tokens`, as `adaptive` or as `disabled`"),
    "output_config": ("output_config", "`output_config` is mapped onto chat with an `effort` of vLLM's list and a "
                      "`json_schema` format"),
    "inline system message": ("messages", "a system message inside `messages` is mapped onto chat once the "
                              "replicas' chat template is known"),
}


def unserved(status: int, body: bytes | None, path: str, backend: str, reason: str | None) -> MmgateError | None:
    """The error for a request forwarded to ``path`` on a backend that does not serve it (a 404
    that is not JSON: a chat-only engine, such as the embedded sim), naming the field that made the
    gateway forward it (``reason``; None: the path is always forwarded); None for any other answer."""
    if status != 404:
        return None
    try:
        if isinstance(orjson.loads(body or b""), dict):
            return None  # the backend's own answer (vLLM's 404 names a model)
    except orjson.JSONDecodeError:
        pass
    where = f"backend {backend} serves no {path} (a chat-only engine, such as the embedded sim)"
    if reason is None:
        return EndpointNotFoundError(f"{where}: the gateway forwards {path} to the backend", param="path")
    param, mapped = _MAPPED.get(reason, (None, "the gateway maps a request onto chat in its plain shapes only"))
    return InvalidRequestError(f"{mapped}; any other is judged by the backend's own /v1/messages, and {where}",
                               param=param)
