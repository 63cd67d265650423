"""The Responses API as vLLM 0.32 serves it (``/v1/responses``, pure logic): a request's input
mapped onto the chat request the engine answers, and the answer written as vLLM writes a response —
one ``message`` output item holding one ``output_text`` — whole, or as its stream of events.

Like a vLLM launched without ``VLLM_ENABLE_RESPONSES_API_STORE``, the sim stores no response by
default: a ``previous_response_id`` is not found (404), a background request is refused (400), and
so are ``GET /v1/responses/{id}`` and its cancel (404). ``--responses-store-mb`` gives it vLLM's
store (``mmgate.sim.response_store``). Tools are checked as vLLM checks them
(``mmgate.sim.request.check_tools``) and echoed as vLLM echoes them, but the sim calls none: it
answers text, as a model that chose no tool; function calls and their outputs already in the input
are read as conversation, and reasoning items are skipped, as vLLM skips them.
"""
from __future__ import annotations

import secrets
import time
from typing import Any

import orjson

from mmgate.sim.errors import InvalidRequestError, ResponseNotFoundError, SimError

__all__ = ["ResponseWriter", "check_fields", "error_body", "not_found", "to_chat_body"]

_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal"})
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
# The request fields the sim reads or echoes, and their JSON types (null: the default).
_FIELDS: dict[str, tuple[type, ...]] = {
    "instructions": (str,), "stream": (bool,), "background": (bool,), "store": (bool,), "temperature": (int, float),
    "top_p": (int, float), "tools": (list,), "tool_choice": (str, dict), "metadata": (dict,),
    "previous_response_id": (str,), "request_id": (str,)}


def not_found(response_id: str) -> ResponseNotFoundError:
    return ResponseNotFoundError(f"Response with id '{response_id}' not found.", param="response_id")


def error_body(exc: SimError) -> dict[str, Any]:
    """vLLM's Responses error body (``invalid_request_error``; its chat errors name a class)."""
    return {"error": {"message": exc.message, "type": "invalid_request_error", "param": exc.param,
                      "code": exc.status}}


def check_fields(body: Any, *, stores: bool) -> None:
    """Raise ``InvalidRequestError`` naming the field unless ``body``'s fields are of the types vLLM
    takes and its mode one this engine serves (``stores``: it keeps responses)."""
    if not isinstance(body, dict):
        raise InvalidRequestError("Request body must be a JSON object.")
    for name, kinds in _FIELDS.items():
        value = body.get(name)
        if value is not None and (not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool))):
            raise InvalidRequestError(f"'{name}' must be {' or '.join(k.__name__ for k in kinds)}.", param=name)
    if body.get("background"):
        if not body.get("store", True):
            raise InvalidRequestError("background can only be used when `store` is true", param="background")
        if not stores:
            raise InvalidRequestError(
                "This vLLM engine does not support `store=True` and therefore does not support the background mode. "
                "To enable these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when "
                "launching the vLLM server.", param="background")


def to_chat_body(body: dict[str, Any], history: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The chat-completions request the engine answers for a Responses request ``body`` (checked
    by ``check_fields``) continuing ``history`` (the stored conversation of its
    ``previous_response_id``, ``None`` when not stored); raises ``InvalidRequestError`` (400) or
    ``ResponseNotFoundError`` (404) naming what it cannot serve."""
    if body.get("previous_response_id") is not None and history is None:
        raise not_found(str(body["previous_response_id"]))
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    messages += history or []
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        messages += [_message(item, f"input[{i}]") for i, item in enumerate(given)
                     if not (isinstance(item, dict) and item.get("type") == "reasoning")]
    else:
        raise InvalidRequestError("'input' must be a string or a list of items.", param="input")
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages,
                            "stream": bool(body.get("stream", False))}
    for ours, theirs in (("max_tokens", "max_output_tokens"), ("temperature", "temperature"), ("top_p", "top_p")):
        if body.get(theirs) is not None:
            chat[ours] = body[theirs]
    return chat


def _message(item: Any, where: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise InvalidRequestError(f"{where} must be an object.", param=where)
    kind = item.get("type", "message")
    if kind == "function_call":
        _strings(item, where, "call_id", "name", "arguments")
        call = {"id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if kind == "function_call_output":
        _strings(item, where, "call_id", "output")
        return {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
    if kind != "message" or not isinstance(item.get("role"), str) or item["role"] not in _ROLES:
        raise InvalidRequestError(f"{where}: unsupported item (type {kind!r}, role {item.get('role')!r}).",
                                  param=where)
    content = item.get("content")
    if isinstance(content, list):
        content = [_part(part, f"{where}.content[{j}]") for j, part in enumerate(content)]
    elif not isinstance(content, str):
        raise InvalidRequestError(f"{where}.content must be a string or a list of parts.", param=f"{where}.content")
    return {"role": _ROLES[item["role"]], "content": content}


def _strings(item: dict[str, Any], where: str, *names: str) -> None:
    for name in names:
        if not isinstance(item.get(name), str):
            raise InvalidRequestError(f"{where}.{name} must be a string.", param=f"{where}.{name}")


def _part(part: Any, where: str) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else None
    if isinstance(kind, str) and kind in _TEXT_PARTS:
        return {"type": "text", "text": part.get("text", part.get("refusal"))}
    if kind == "input_image":
        url = part.get("image_url")
        image: dict[str, Any] = {"type": "image_url", "image_url": {"url": url} if url is not None else None}
        if part.get("uuid") is not None:
            image["uuid"] = part["uuid"]
        return image
    raise InvalidRequestError(f"{where}: unsupported content part {kind!r}.", param=where)


def _ids() -> tuple[str, str]:
    return f"resp_{secrets.token_hex(8)}", f"msg_{secrets.token_hex(8)}"


def _usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {"input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0, "input_tokens_per_turn": [],
                                     "cached_tokens_per_turn": []},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0, "output_tokens_per_turn": [],
                                      "tool_output_tokens_per_turn": []},
            "total_tokens": input_tokens + output_tokens}


# A function tool as vLLM 0.32 echoes it (the openai package's ``FunctionTool``, every field).
_FUNCTION_TOOL_FIELDS = ("name", "parameters", "strict", "type", "allowed_callers", "async", "defer_loading",
                         "description", "output_schema")


def _echoed_tool(tool: Any) -> Any:
    if isinstance(tool, dict) and tool.get("type") == "function":
        return {name: tool.get(name) for name in _FUNCTION_TOOL_FIELDS}
    return tool


def _number(body: dict[str, Any], name: str) -> float:
    """A sampling setting as vLLM echoes it (1.0 when unset; ``check_fields`` checked its type)."""
    value = body.get(name)
    return 1.0 if value is None else float(value)


class ResponseWriter:
    """One response's object and, streamed, its events in vLLM's order: ``response.created``,
    ``response.in_progress``, the item and its part added, one ``response.output_text.delta`` per
    token, the text, part and item done, ``response.completed`` (which carries the status:
    ``incomplete`` for an answer cut at ``max_output_tokens``)."""

    def __init__(self, body: dict[str, Any], model: str, input_tokens: int) -> None:
        self.response_id, self.item_id = _ids()
        if isinstance(body.get("request_id"), str):  # vLLM names a response by its request's id
            self.response_id = body["request_id"]
        self._input_tokens = input_tokens
        self._sequence = 0
        self._head: dict[str, Any] = {
            "id": self.response_id, "created_at": int(time.time()), "incomplete_details": None,
            "instructions": body.get("instructions"), "metadata": body.get("metadata"), "model": model,
            "object": "response", "output": [], "parallel_tool_calls": True,
            "temperature": _number(body, "temperature"),
            "tool_choice": body.get("tool_choice", "auto" if body.get("tools") else "none"),
            "tools": [_echoed_tool(tool) for tool in body.get("tools") or []],
            "top_p": _number(body, "top_p"), "background": bool(body.get("background")),
            "max_output_tokens": body.get("max_output_tokens"), "max_tool_calls": None,
            "previous_response_id": body.get("previous_response_id"),
            "prompt": None, "reasoning": None, "service_tier": "auto", "status": "in_progress", "text": None,
            "top_logprobs": None, "truncation": "disabled", "usage": None, "user": None, "presence_penalty": 0.0,
            "frequency_penalty": 0.0, "kv_transfer_params": None, "ec_transfer_params": None,
            "input_messages": None, "output_messages": None,
        }

    def _item(self, text: str | None) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if text is not None:
            content.append({"annotations": [], "text": text, "type": "output_text", "logprobs": None})
        return {"id": self.item_id, "content": content, "role": "assistant",
                "status": "in_progress" if text is None else "completed", "type": "message", "phase": None}

    def response(self, text: str, finish_reason: str, output_tokens: int) -> dict[str, Any]:
        """The whole response: ``completed``, or ``incomplete`` when cut at its token limit."""
        cut = finish_reason == "length"
        return {**self._head, "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
                "output": [self._item(text)], "status": "incomplete" if cut else "completed",
                "usage": _usage(self._input_tokens, output_tokens)}

    def queued(self) -> dict[str, Any]:
        """A background response before its answer (vLLM stores it so, ``queued``)."""
        return {**self._head, "status": "queued"}

    def _event(self, kind: str, fields: dict[str, Any]) -> bytes:
        data = orjson.dumps({**fields, "sequence_number": self._sequence, "type": kind})
        self._sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"

    def opening(self) -> list[bytes]:
        """The events before the first token."""
        where = {"item_id": self.item_id, "output_index": 0}
        return [
            self._event("response.created", {"response": self._head}),
            self._event("response.in_progress", {"response": self._head}),
            self._event("response.output_item.added", {"item": self._item(None), "output_index": 0}),
            self._event("response.content_part.added", {"content_index": 0, **where, "part": {
                "annotations": [], "text": "", "type": "output_text", "logprobs": []}})]

    def delta(self, text: str) -> bytes:
        return self._event("response.output_text.delta", {"content_index": 0, "delta": text, "item_id": self.item_id,
                                                          "logprobs": [], "output_index": 0})

    def closing(self, text: str, finish_reason: str, output_tokens: int) -> list[bytes]:
        """The events after the last token."""
        where = {"item_id": self.item_id, "output_index": 0}
        part: dict[str, Any] = {"annotations": [], "text": text, "type": "output_text", "logprobs": None}
        return [
            self._event("response.output_text.done", {"content_index": 0, **where, "logprobs": [], "text": text}),
            self._event("response.content_part.done", {"content_index": 0, **where, "part": part}),
            self._event("response.output_item.done", {"item": self._item(text), "output_index": 0}),
            self._event("response.completed", {"response": self.response(text, finish_reason, output_tokens)})]
