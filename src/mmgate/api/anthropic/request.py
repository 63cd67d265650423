"""An Anthropic Messages request checked, then mapped onto a chat-completions body the way vLLM
0.32 maps it internally (``vllm/entrypoints/anthropic/serving.py``,
``AnthropicServingMessages.to_chat_completion_request``), field by field, so the engine renders
the same prompt and samples the same way — but every image becomes a chat ``image_url`` part the
gateway's pipeline loads, labels and strips on repeats.

Requests whose mapping depends on the serving replica's own state are not mapped (``FORWARD``
reasons): vLLM probes its chat template to decide how inline ``system`` messages are merged and
which reasoning effort ``thinking: disabled`` means. Those go to the backend's ``/v1/messages``
as they are, their images policed first (``mmgate.api.anthropic.forward``).

Checks mirror vLLM's pydantic models (``vllm/entrypoints/anthropic/protocol.py``): a bad field is
a 400 naming it. Pure logic: no I/O.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from mmgate.errors import InvalidRequestError

_ROLES = frozenset({"user", "assistant", "system"})
_BLOCK_TYPES = frozenset({
    "text", "image", "tool_use", "tool_result", "tool_reference", "thinking", "redacted_thinking",
    "tool_addition", "tool_removal",
})
_TOOL_CHANGES = ("tool_addition", "tool_removal")
_TOOL_CHOICES = frozenset({"auto", "any", "tool", "none"})
_BILLING = "x-anthropic-billing-header"
# Request fields vLLM copies onto its chat request unchanged.
_COPIED = ("temperature", "top_p", "top_k", "watermarking", "cache_salt", "kv_transfer_params",
           "ec_transfer_params", "vllm_xargs", "chat_template_kwargs")
STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}


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
        if message.get("role") not in _ROLES:
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
        if not isinstance(choice, dict) or choice.get("type") not in _TOOL_CHOICES:
            raise InvalidRequestError("'tool_choice.type' must be one of auto, any, tool, none",
                                      param="tool_choice.type")
        if choice["type"] == "tool" and (not isinstance(choice.get("name"), str) or not choice["name"]):
            raise InvalidRequestError("'tool_choice.name' is required when type is 'tool'", param="tool_choice.name")
        _optional(choice, "disable_parallel_tool_use", bool, "a boolean", where="tool_choice.")
    return body


def forward_reason(body: dict[str, Any]) -> str | None:
    """Why this request cannot be mapped faithfully (it is then forwarded as it is), or None."""
    if body.get("thinking") is not None:
        return "thinking"  # 'disabled' maps to an effort vLLM probes from its chat template
    if body.get("output_config") is not None:
        return "output_config"
    if any(m.get("role") == "system" for m in body["messages"]):
        return "inline system message"  # merged or not by a probe of the chat template
    return None


def to_chat_body(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The chat-completions body vLLM builds for ``body`` (checked, and with no forward reason),
    and each image part's chat path → its Anthropic path (``messages[0].content[1].source``), so
    errors name the client's field."""
    messages: list[dict[str, Any]] = []
    params: dict[str, str] = {}
    system = _system_text(body.get("system"))
    if system:
        messages.append({"role": "system", "content": system})
    for i, message in enumerate(body["messages"]):
        _convert_message(message, messages, params, f"messages[{i}]")
    chat: dict[str, Any] = {"model": body["model"], "messages": messages,
                            "max_tokens": body["max_tokens"], "max_completion_tokens": body["max_tokens"]}
    # Explicit, as vLLM sets them: null is not the chat defaults ([] and "none").
    chat["stop"] = body.get("stop_sequences")
    for name in _COPIED:
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = dict(STREAM_OPTIONS)
    choice = body.get("tool_choice")
    chat["tool_choice"] = None
    if choice is not None:
        chat["parallel_tool_calls"] = not choice.get("disable_parallel_tool_use")
        kind = choice["type"]
        if kind == "tool":
            chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
        else:
            chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    tools = body.get("tools")
    if tools is not None:
        chat["tools"] = [_chat_tool(tool) for tool in tools]
        if chat["tool_choice"] is None:
            chat["tool_choice"] = "auto"
    return chat, params


def image_sources(body: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every image block's ``source`` (with its path) in messages and tool results."""
    for i, message in enumerate(body.get("messages") or []):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for j, block in enumerate(content):
            where = f"messages[{i}].content[{j}]"
            if block.get("type") == "image" and isinstance(block.get("source"), dict):
                yield f"{where}.source", block["source"]
            inner = block.get("content") if block.get("type") == "tool_result" else None
            if isinstance(inner, list):
                for k, item in enumerate(inner):
                    if isinstance(item, dict) and item.get("type") == "image":
                        source = item.get("source")
                        yield f"{where}.content[{k}].source", source if isinstance(source, dict) else {}


def source_url(source: dict[str, Any]) -> str:
    """vLLM's ``_convert_image_source_to_url``: a url source's URL, else a data URL (base64)."""
    if source.get("type") == "url":
        return str(source.get("url", ""))
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _convert_message(message: dict[str, Any], out: list[dict[str, Any]], params: dict[str, str], where: str) -> None:
    role = message["role"]
    chat: dict[str, Any] = {"role": role}
    content = message["content"]
    images: dict[int, str] = {}  # part index → Anthropic path, placed once the message's index is known
    if isinstance(content, str):
        chat["content"] = content
    else:
        parts: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        reasoning: list[str] = []
        for j, block in enumerate(content):
            at = f"{where}.content[{j}]"
            if block["type"] == "image" and block.get("source"):
                images[len(parts)] = f"{at}.source"
            _convert_block(block, role, parts, calls, reasoning, out, params, at)
        if reasoning:
            chat["reasoning"] = "".join(reasoning)
        if calls:
            chat["tool_calls"] = calls
        if parts:
            chat["content"] = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts
    if not (role == "user" and "content" not in chat):
        for j, at in images.items():
            params[f"messages[{len(out)}].content[{j}]"] = at
        out.append(chat)


def _convert_block(
    block: dict[str, Any], role: str, parts: list[dict[str, Any]], calls: list[dict[str, Any]],
    reasoning: list[str], out: list[dict[str, Any]], params: dict[str, str], where: str,
) -> None:
    kind = block["type"]
    if kind == "text" and block.get("text"):
        parts.append({"type": "text", "text": block["text"]})
    elif kind == "image" and block.get("source"):
        parts.append({"type": "image_url", "image_url": {"url": source_url(block["source"])}})
    elif kind == "thinking" and block.get("thinking") is not None:
        reasoning.append(block["thinking"])
    elif kind == "tool_use":
        calls.append({
            "id": block.get("id") or f"call_{int(time.time())}", "type": "function",
            # json.dumps as vLLM writes it (", " and ": "): the arguments are part of the prompt.
            "function": {"name": block.get("name") or "", "arguments": json.dumps(block.get("input") or {})},
        })
    elif kind == "tool_result":
        if role == "user":
            _user_tool_result(block, out, params, where)
        else:
            text = str(block["content"]) if block.get("content") else ""
            parts.append({"type": "text", "text": f"Tool result: {text}"})


def _user_tool_result(block: dict[str, Any], out: list[dict[str, Any]], params: dict[str, str], where: str) -> None:
    """A user's tool_result: a tool message, then a user message with its images, then its tool
    references (vLLM's ``_convert_user_tool_result``)."""
    content = block.get("content")
    text = ""
    images: list[str] = []
    paths: list[str] = []
    references: list[dict[str, Any]] = []
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts: list[str] = []
        for k, item in enumerate(content):
            if not isinstance(item, dict):
                continue
            kind = item.get("type")
            if kind == "text":
                texts.append(item.get("text", ""))
            elif kind == "image":
                url = source_url(item.get("source", {}))
                if url:
                    images.append(url)
                    paths.append(f"{where}.content[{k}].source")
            elif kind == "tool_reference":
                name = item.get("tool_name") or item.get("name")
                if name:
                    references.append({"type": "tool_reference", "name": name})
        text = "\n".join(texts)
    call_id = block.get("tool_use_id") or ""
    out.append({"role": "tool", "tool_call_id": call_id, "content": text or ""})
    if images:
        for n, at in enumerate(paths):
            params[f"messages[{len(out)}].content[{n}]"] = at
        out.append({"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}} for u in images]})
    if references:
        out.append({"role": "tool", "tool_call_id": call_id, "content": references})


def _system_text(system: Any) -> str:
    if isinstance(system, str):
        return system
    if not system:
        return ""
    return "".join(
        b["text"] for b in system if b.get("type") == "text" and b.get("text") and not b["text"].startswith(_BILLING)
    )


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    schema = tool["input_schema"]
    if "type" not in schema:
        schema["type"] = "object"  # vLLM's default
    function: dict[str, Any] = {"name": tool["name"]}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    function["parameters"] = schema
    for name in ("strict", "defer_loading"):
        if tool.get(name) is not None:
            function[name] = tool[name]
    return {"type": "function", "function": function}


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
        if block.get("type") not in _BLOCK_TYPES:
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
