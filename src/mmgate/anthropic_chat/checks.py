"""An Anthropic Messages request's checks: the ones vLLM's pydantic models make
(``vllm/entrypoints/anthropic/protocol.py``), and those that keep the mapping
(``mmgate.anthropic_chat.request``) from failing on what vLLM leaves unchecked; a bad field is a 400
naming it, never a 500. Pure logic: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from mmgate.errors import InvalidRequestError

_ROLES = frozenset({"user", "assistant", "system"})
_BLOCK_TYPES = frozenset({
    "text", "image", "tool_use", "tool_result", "tool_reference", "thinking", "redacted_thinking",
    "tool_addition", "tool_removal",
})
_TOOL_CHANGES = ("tool_addition", "tool_removal")
_TOOL_CHOICES = frozenset({"auto", "any", "tool", "none"})
# The string fields of a tool result's items that the mapping reads, by item type.
_INNER_STRINGS = {"text": ("text",), "tool_reference": ("tool_name", "name")}


def check_messages_body(body: Any, *, count_tokens: bool = False) -> dict[str, Any]:
    """The checks vLLM's request model makes, as 400s naming the field; returns ``body``."""
    if not isinstance(body, dict):
        raise InvalidRequestError("request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("'model' is required and must be a non-empty string", param="model")
    if not count_tokens:
        max_tokens = body.get("max_tokens")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
            raise InvalidRequestError("'max_tokens' is required and must be an integer", param="max_tokens")
        if max_tokens <= 0:
            raise InvalidRequestError("'max_tokens' must be positive", param="max_tokens")
        _optional(body, "stream", bool, "a boolean")
        stops = body.get("stop_sequences")
        if stops is not None and (not isinstance(stops, list) or not all(isinstance(s, str) for s in stops)):
            raise InvalidRequestError("'stop_sequences' must be an array of strings", param="stop_sequences")
        for name in ("temperature", "top_p"):
            _optional(body, name, (int, float), "a number")
        _optional(body, "top_k", int, "an integer")
        _optional(body, "metadata", dict, "an object")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise InvalidRequestError("'messages' must be an array", param="messages")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise InvalidRequestError("each message must be an object", param=where)
        if not _named(message.get("role"), _ROLES):
            raise InvalidRequestError("'role' must be one of user, assistant, system", param=f"{where}.role")
        _check_content(message.get("content"), f"{where}.content", tool_changes=message["role"] == "system")
    system = body.get("system")
    if system is not None:
        _check_content(system, "system", tool_changes=False)
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise InvalidRequestError("'tools' must be an array", param="tools")
        for i, tool in enumerate(tools):
            _check_tool(tool, f"tools[{i}]")
    choice = body.get("tool_choice")
    if choice is not None:
        if not isinstance(choice, dict) or not _named(choice.get("type"), _TOOL_CHOICES):
            raise InvalidRequestError("'tool_choice.type' must be one of auto, any, tool, none",
                                      param="tool_choice.type")
        if choice["type"] == "tool" and (not isinstance(choice.get("name"), str) or not choice["name"]):
            raise InvalidRequestError("'tool_choice.name' is required when type is 'tool'", param="tool_choice.name")
        _optional(choice, "disable_parallel_tool_use", bool, "a boolean", where="tool_choice.")
    return body


def _named(value: Any, names: Collection[str]) -> bool:
    """``value`` is one of ``names`` (a list or an object is not: a set lookup would raise)."""
    return isinstance(value, str) and value in names


def _check_content(content: Any, where: str, *, tool_changes: bool) -> None:
    """vLLM's checks of a ``content``; ``tool_changes``: tool_addition/tool_removal blocks allowed."""
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise InvalidRequestError("'content' must be a string or an array of content blocks", param=where)
    for j, block in enumerate(content):
        at = f"{where}[{j}]"
        if not isinstance(block, dict):
            raise InvalidRequestError("each content block must be an object", param=at)
        if not _named(block.get("type"), _BLOCK_TYPES):
            raise InvalidRequestError(
                f"unknown content block type {block.get('type')!r}: one of {', '.join(sorted(_BLOCK_TYPES))}",
                param=f"{at}.type",
            )
        if block["type"] in _TOOL_CHANGES and not tool_changes:
            raise InvalidRequestError(f"{block['type']} blocks are only allowed in messages with role 'system'",
                                      param=f"{at}.type")
        for name in ("text", "id", "tool_use_id", "name", "thinking", "signature", "data", "tool_name"):
            _optional(block, name, str, "a string", where=f"{at}.")
        _optional(block, "source", dict, "an object", where=f"{at}.")
        _optional(block, "input", dict, "an object", where=f"{at}.")
        _optional(block, "is_error", bool, "a boolean", where=f"{at}.")
        inner = block.get("content")
        if inner is not None and not isinstance(inner, str) and not (
            isinstance(inner, list) and all(isinstance(x, dict) for x in inner)
        ):
            raise InvalidRequestError("'content' must be a string or an array of objects", param=f"{at}.content")
        if block["type"] == "image" and isinstance(block.get("source"), dict):
            _check_source(block["source"], f"{at}.source")
        if isinstance(inner, list):
            for k, item in enumerate(inner):
                # What a user's tool result is mapped from (vLLM joins the texts: a number was its 500).
                for name in _INNER_STRINGS.get(item.get("type"), ()) if isinstance(item.get("type"), str) else ():
                    if name in item and not isinstance(item[name], str):
                        raise InvalidRequestError(f"'{name}' must be a string", param=f"{at}.content[{k}].{name}")
                if item.get("type") == "image":
                    _check_source(item.get("source"), f"{at}.content[{k}].source")


def _check_source(source: Any, where: str) -> None:
    if not isinstance(source, dict):
        raise InvalidRequestError("an image block needs a 'source' object", param=where)
    if source.get("type") == "url":
        if not isinstance(source.get("url"), str) or not source["url"]:
            raise InvalidRequestError("a url image source needs a non-empty 'url' string", param=f"{where}.url")
        return
    if source.get("type") == "file":
        raise InvalidRequestError("'file' image sources are not supported: vLLM has no Files API; send base64 "
                                  "or url", param=f"{where}.type")
    if not isinstance(source.get("data", ""), str) or not isinstance(source.get("media_type", ""), str):
        raise InvalidRequestError("a base64 image source needs 'media_type' and 'data' strings", param=where)


def _check_tool(tool: Any, where: str) -> None:
    if not isinstance(tool, dict):
        raise InvalidRequestError("each tool must be an object", param=where)
    if not isinstance(tool.get("name"), str):
        raise InvalidRequestError("a tool needs a 'name' string", param=f"{where}.name")
    if not isinstance(tool.get("input_schema"), dict):
        raise InvalidRequestError("a tool needs an 'input_schema' object", param=f"{where}.input_schema")
    _optional(tool, "description", str, "a string", where=f"{where}.")
    _optional(tool, "strict", bool, "a boolean", where=f"{where}.")
    _optional(tool, "defer_loading", bool, "a boolean", where=f"{where}.")


def _optional(obj: dict[str, Any], name: str, kind: type | tuple[type, ...], what: str, *, where: str = "") -> None:
    value = obj.get(name)
    if value is None:
        return
    if isinstance(value, bool) and kind is not bool:
        raise InvalidRequestError(f"'{name}' must be {what}", param=where + name)
    if not isinstance(value, kind):
        raise InvalidRequestError(f"'{name}' must be {what}", param=where + name)
