"""Errors in Anthropic's shape, as vLLM 0.32 writes them (``api_router.translate_error_response``);
the message a chat completion maps back to is ``mmgate.anthropic_chat.reply``'s.

Pure logic: no I/O.
"""

from __future__ import annotations

from typing import Any

import orjson

from mmgate.errors import BackendStatusError, EndpointNotFoundError, InvalidRequestError, MmgateError

# Anthropic's error types for the gateway's own errors, by status (a backend's error keeps the
# type vLLM gave it, as vLLM's own endpoint does).
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 408: "timeout_error", 413: "request_too_large", 415: "invalid_request_error",
                429: "rate_limit_error", 503: "overloaded_error"}


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


def path_not_served(status: int, answer: Any) -> bool:
    """Whether a backend's answer (its body, parsed) says it serves no such path: a 404 that is not
    an error object of its own (vLLM's 404 names a model it does not serve)."""
    return status == 404 and not (isinstance(answer, dict) and "error" in answer)


def unserved(status: int, body: bytes | None, path: str, backend: str, reason: str | None) -> MmgateError | None:
    """The error for a request forwarded to ``path`` on a backend that does not serve it
    (``path_not_served``: a chat-only engine), naming the field that made the gateway forward it
    (``reason``; None: the path is always forwarded); None for any other answer."""
    if status != 404:
        return None
    try:
        answer = orjson.loads(body or b"")
    except orjson.JSONDecodeError:
        answer = None
    if not path_not_served(status, answer):
        return None
    where = f"backend {backend} serves no {path} (a chat-only engine)"
    if reason is None:
        return EndpointNotFoundError(f"{where}: the gateway forwards {path} to the backend", param="path")
    param, mapped = _MAPPED.get(reason, (None, "the gateway maps a request onto chat in its plain shapes only"))
    return InvalidRequestError(f"{mapped}; any other is judged by the backend's own /v1/messages, and {where}",
                               param=param)
