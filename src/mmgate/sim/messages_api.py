"""Anthropic's Messages API as vLLM 0.32 serves it (``/v1/messages``, pure logic): vLLM maps a
Messages request onto its own chat completions and maps the answer back
(``AnthropicServingMessages``), and so does the sim, with the mapping the gateway uses
(``mmgate.anthropic_chat``, proven against vLLM's own converters by tests/vllm/test_messages_oracle.py).
The sim is a chat engine without a chat template: ``thinking: disabled`` is ``reasoning_effort:
none`` and a system message inside ``messages`` stays where it stands, as the gateway assumes of a
backend that has no template to probe.

Errors take vLLM's two shapes: a request its pydantic model refuses is a 400 in the OpenAI shape of
vLLM's FastAPI handler (``Refused``); an error of the chat path (an unknown model, tools without a
parser, an image that does not load) is in Anthropic's, with the chat error's type.
``count_tokens`` maps the request the same way and counts its prompt, images included, as vLLM
renders it: no ``max_tokens``, and nothing the engine would check before generating.
"""

from __future__ import annotations

from typing import Any

import orjson

from mmgate.anthropic_chat.checks import check_messages_body
from mmgate.anthropic_chat.reply import message_from_chat
from mmgate.anthropic_chat.request import forward_reason, to_chat_body
from mmgate.anthropic_chat.stream import StreamMapper
from mmgate.errors import InvalidRequestError as BadMessagesRequest
from mmgate.sim.errors import SimError

__all__ = ["Frames", "Refused", "counted", "error_body", "message_from_chat", "to_chat"]

# pydantic's lax reading of the scalars vLLM's request model declares: "5" and true are integers,
# "yes" and 1 booleans, "0.5" a number.
_INTEGERS, _NUMBERS, _BOOLEANS = ("max_tokens", "top_k"), ("temperature", "top_p"), ("stream",)
# A count request's stand-in for max_tokens: above any thinking budget.
UNBOUNDED = 2**62
_TRUE, _FALSE = frozenset({"1", "on", "t", "true", "y", "yes"}), frozenset({"0", "off", "f", "false", "n", "no"})


class Refused(Exception):
    """A request vLLM's request model refuses: a 400 in the shape of vLLM's validation handler
    (``param``: the field as pydantic names it, ``body.messages.0.role``)."""

    status = 400

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        where = None if param is None else ".".join(["body", *filter(None, param.replace("[", ".").replace("]", "")
                                                                      .split("."))])
        self.body = {"error": {"message": message, "type": "Bad Request", "param": where, "code": 400}}


def to_chat(raw: bytes, *, count_tokens: bool = False) -> dict[str, Any]:
    """The chat request the engine answers for the Messages request ``raw`` (``count_tokens``: for
    a count, which has no ``max_tokens`` and is not generated); raises ``Refused``."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise Refused(f"JSON decode error: {exc}") from exc
    if isinstance(body, dict):
        _lax(body)
    try:
        check_messages_body(body, count_tokens=count_tokens)
    except BadMessagesRequest as exc:
        raise Refused(exc.message, exc.param) from exc
    if count_tokens:  # the mapping wants one; vLLM's count request model has none to check it against
        body = {**body, "max_tokens": UNBOUNDED, "stream": False}
    _coerce(body)
    reason = forward_reason(body, "none", False)
    if reason is not None:
        raise Refused(f"{reason}: not a shape vLLM's request model takes", reason)
    chat = to_chat_body(body, "none", False)[0]
    if count_tokens:  # rendered, not generated: what the engine checks first does not apply
        for name in ("max_tokens", "max_completion_tokens", "thinking_token_budget"):
            chat.pop(name, None)
    return chat


def counted(prompt_tokens: int) -> dict[str, Any]:
    """vLLM's count_tokens answer."""
    return {"input_tokens": prompt_tokens, "context_management": {"original_input_tokens": prompt_tokens}}


def _lax(body: dict[str, Any]) -> None:
    """``body``'s scalars read as pydantic reads them in lax mode, and every image source that is
    not a URL taken as base64 (vLLM's ``_convert_image_source_to_url``: a file source is a data
    URL of nothing, an image that does not load)."""
    for name in _INTEGERS:
        if (number := _integer(body.get(name))) is not None:
            body[name] = number
    for name in _NUMBERS:
        value = body.get(name)
        if isinstance(value, str):
            try:
                body[name] = float(value)
            except ValueError:
                pass
    for name in _BOOLEANS:
        value = body.get(name)
        text = str(value).lower() if isinstance(value, str | int) and not isinstance(value, bool) else None
        if text in _TRUE or text in _FALSE:
            body[name] = text in _TRUE
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        for block in content if isinstance(content, list) else []:
            source = block.get("source") if isinstance(block, dict) and block.get("type") == "image" else None
            if isinstance(source, dict) and source.get("type") not in ("url", "base64"):
                source["type"] = "base64"


def _coerce(body: dict[str, Any]) -> None:
    """What vLLM's pydantic model does to ``thinking`` beyond the shapes the mapping takes: an
    integral budget given as a number or a string becomes an int, and one under 1024 or not under
    ``max_tokens`` is refused."""
    thinking = body.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") != "enabled":
        return
    budget = _integer(thinking.get("budget_tokens"), booleans=False)
    if budget is None:
        raise Refused("Input should be a valid integer", "thinking.enabled.budget_tokens")
    if budget < 1024:
        raise Refused("Input should be greater than or equal to 1024", "thinking.enabled.budget_tokens")
    if budget >= body["max_tokens"]:
        raise Refused("Value error, thinking.budget_tokens must be less than max_tokens", "")
    thinking["budget_tokens"] = budget


def _integer(value: Any, *, booleans: bool = True) -> int | None:
    """``value`` as pydantic's lax mode reads an integer (an int, an integral float, a string of
    decimal digits; a boolean where ``booleans``), or None."""
    if isinstance(value, bool):
        return int(value) if booleans else None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("+-").isdecimal():
        try:
            return int(value)
        except ValueError:  # past Python's digit limit
            return None
    return None


def error_body(exc: SimError) -> dict[str, Any]:
    """An error of the chat path in Anthropic's shape (vLLM's ``translate_error_response``)."""
    kind = "NotFoundError" if exc.status == 404 else "BadRequestError" if exc.status < 500 else "InternalServerError"
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


class Frames:
    """Maps the engine's chat SSE frames, one at a time, to Anthropic's events (one per stream)."""

    def __init__(self) -> None:
        self._mapper = StreamMapper()

    def __call__(self, frame: bytes) -> bytes:
        out = b""
        for line in frame.split(b"\n"):
            if line.startswith(b"data: "):
                out += self._mapper.feed(line[6:].decode())
        return out
