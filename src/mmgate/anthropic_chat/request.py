"""An Anthropic Messages request checked, then mapped onto a chat-completions body the way vLLM
0.32 maps it internally (``vllm/entrypoints/anthropic/serving.py``,
``AnthropicServingMessages.to_chat_completion_request``), field by field, so the engine renders
the same prompt and samples the same way — but every image becomes a chat ``image_url`` part the
gateway's pipeline loads, labels and strips on repeats.

Some of the mapping depends on the serving replica's own state: vLLM probes its chat template to
decide whether inline ``system`` messages are merged and which reasoning effort ``thinking:
disabled`` means. The gateway asks a replica the same (``mmgate.api.anthropic.template_probes``)
and maps such a request once it knows; until then it is not mapped (``forward_reason``). Nor are
``thinking`` and ``output_config`` settings of another shape than the plain ones (``enabled`` with
an integer budget of 1024 or more, ``adaptive``; an effort of vLLM's list, a JSON schema format),
which vLLM's own validation judges. Those go to the backend's ``/v1/messages`` as they are, their
images policed first (``mmgate.api.anthropic.handlers``).

The checks before it (``check_messages_body``, re-exported here) are ``mmgate.anthropic_chat.checks``.
Pure logic: no I/O.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from mmgate.anthropic_chat.checks import check_messages_body

__all__ = ["STREAM_OPTIONS", "HeldURL", "check_messages_body", "forward_reason", "has_inline_system", "image_sources",
           "is_disabled_thinking", "source_url", "to_chat_body"]

_BILLING = "x-anthropic-billing-header"
# Request fields vLLM copies onto its chat request unchanged.
_COPIED = ("temperature", "top_p", "top_k", "watermarking", "cache_salt", "kv_transfer_params",
           "ec_transfer_params", "vllm_xargs", "chat_template_kwargs")
STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}
# (media_type, data) → the data URL they make when it is one the gateway holds (the held string
# itself: ``mmgate.media.repeats.HeldImages.data_url``), else None.
HeldURL = Callable[[Any, Any], str | None]


# vLLM's Literal values for these fields (``vllm/entrypoints/anthropic/protocol.py``).
_EFFORTS = frozenset({"low", "medium", "high", "xhigh", "max"})
_DISPLAYS = frozenset({"summarized", "omitted", "updates"})


def forward_reason(body: dict[str, Any], disabled_effort: str | None = None,
                   merge_inline_system: bool | None = None) -> str | None:
    """Why this request cannot be mapped faithfully (it is then forwarded as it is), or None.
    ``disabled_effort``, ``merge_inline_system``: what the model's replicas' chat template makes of
    ``thinking: disabled`` and of a system message inside ``messages``, when known
    (``mmgate.api.anthropic.template_probes``)."""
    if body.get("thinking") is not None and _thinking_fields(body, disabled_effort) is None:
        # 'disabled' with its effort not known; a shape other than the plain ones, which vLLM's
        # own validation judges (and refuses or coerces).
        return "thinking"
    if body.get("output_config") is not None and _output_config(body["output_config"]) is None:
        return "output_config"
    if merge_inline_system is None and has_inline_system(body):
        return "inline system message"  # merged or not by a probe of the chat template
    return None


def has_inline_system(body: dict[str, Any]) -> bool:
    """Whether ``body`` has a system message inside ``messages`` (vLLM's extension)."""
    return any(m.get("role") == "system" for m in body["messages"])


def is_disabled_thinking(body: dict[str, Any]) -> bool:
    """Whether ``body`` turns thinking off (``{"type": "disabled"}``)."""
    thinking = body.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") == "disabled"


def _thinking_fields(body: dict[str, Any], disabled_effort: str | None) -> dict[str, Any] | None:
    """The chat fields vLLM sets for a plain ``thinking``: ``enabled`` with an integer budget of at
    least 1024 tokens, under ``max_tokens`` (``thinking_token_budget``), ``adaptive`` (none), or
    ``disabled`` with its effort known (``reasoning_effort``); None for any other (forwarded)."""
    thinking = body["thinking"]
    if not isinstance(thinking, dict) or thinking.get("display") not in (None, *_DISPLAYS):
        return None
    if thinking.get("type") == "adaptive":
        return {}
    if thinking.get("type") == "disabled":
        return None if disabled_effort is None else {"reasoning_effort": disabled_effort}
    budget, max_tokens = thinking.get("budget_tokens"), body.get("max_tokens")
    if thinking.get("type") == "enabled" and type(budget) is int and type(max_tokens) is int and \
            1024 <= budget < max_tokens:
        return {"thinking_token_budget": budget}
    return None


def _output_config(config: Any) -> dict[str, Any] | None:
    """The chat fields vLLM sets for a plain ``output_config`` (an effort of its list, a JSON
    schema format), or None for any other shape (forwarded)."""
    if not isinstance(config, dict) or config.get("effort") not in (None, *_EFFORTS):
        return None
    fields: dict[str, Any] = {}
    form = config.get("format")
    if form is not None:
        if not isinstance(form, dict) or form.get("type", "json_schema") != "json_schema" or \
                not isinstance(form.get("schema"), dict | None):
            return None
        if form.get("schema"):  # vLLM: only a schema makes a response format
            fields["response_format"] = {"type": "json_schema",
                                         "json_schema": {"name": "json_schema", "schema": form["schema"]}}
    if config.get("effort") is not None:
        fields["reasoning_effort"] = config["effort"]
    return fields


def to_chat_body(body: dict[str, Any], disabled_effort: str | None = None,
                 merge_inline_system: bool = False, held: HeldURL | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """The chat-completions body vLLM builds for ``body`` (checked, and with no forward reason),
    and each image part's chat path → its Anthropic path (``messages[0].content[1].source``), so
    errors name the client's field. ``merge_inline_system``: system messages inside ``messages``
    join the leading system prompt (else each stays in place, its text only, as in vLLM).
    ``held``: ``source_url``'s."""
    messages: list[dict[str, Any]] = []
    params: dict[str, str] = {}
    system = _system_text(body.get("system"))
    if merge_inline_system:
        system += "".join(_inline_system_text(m) or "" for m in body["messages"] if m["role"] == "system")
    if system:
        messages.append({"role": "system", "content": system})
    for i, message in enumerate(body["messages"]):
        if message["role"] == "system":
            if not merge_inline_system and (text := _inline_system_text(message)):
                messages.append({"role": "system", "content": text})
            continue
        _convert_message(message, messages, params, f"messages[{i}]", held)
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
    # vLLM's order: output_config, then thinking (whose 'disabled' effort wins).
    if body.get("output_config") is not None:
        chat.update(_output_config(body["output_config"]) or {})
    if body.get("thinking") is not None:
        chat.update(_thinking_fields(body, disabled_effort) or {})
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


def source_url(source: dict[str, Any], held: HeldURL | None = None) -> str:
    """vLLM's ``_convert_image_source_to_url``: a url source's URL, else a data URL (base64);
    ``held`` gives the one the gateway holds, when it is that text."""
    if source.get("type") == "url":
        return str(source.get("url", ""))
    media_type, data = source.get("media_type", "image/jpeg"), source.get("data", "")
    if held is not None and (url := held(media_type, data)) is not None:
        return url
    return f"data:{media_type};base64,{data}"


def _convert_message(message: dict[str, Any], out: list[dict[str, Any]], params: dict[str, str], where: str,
                     held: HeldURL | None) -> None:
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
            _convert_block(block, role, parts, calls, reasoning, out, params, at, held)
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
    reasoning: list[str], out: list[dict[str, Any]], params: dict[str, str], where: str, held: HeldURL | None,
) -> None:
    kind = block["type"]
    if kind == "text" and block.get("text"):
        parts.append({"type": "text", "text": block["text"]})
    elif kind == "image" and block.get("source"):
        parts.append({"type": "image_url", "image_url": {"url": source_url(block["source"], held)}})
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
            _user_tool_result(block, out, params, where, held)
        else:
            text = str(block["content"]) if block.get("content") else ""
            parts.append({"type": "text", "text": f"Tool result: {text}"})


def _user_tool_result(block: dict[str, Any], out: list[dict[str, Any]], params: dict[str, str], where: str,
                      held: HeldURL | None) -> None:
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
                url = source_url(item.get("source", {}), held)
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


def _inline_system_text(message: dict[str, Any]) -> str | None:
    """vLLM's ``_extract_system_text``: a system message's text, billing headers dropped (other
    blocks, images too, are not carried)."""
    content = message["content"]
    if isinstance(content, str):
        return None if content.startswith(_BILLING) else content
    return "".join(b["text"] for b in content if b.get("type") == "text" and b.get("text")
                   and not b["text"].startswith(_BILLING)) or None


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
