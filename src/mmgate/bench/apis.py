"""The client APIs a benchmark session speaks: OpenAI Chat Completions (``chat``), OpenAI Responses
(``responses``) and Anthropic Messages (``messages``).

Each lays a session's turns (texts, planned images, earlier replies) out in its API's request shape
and reads its API's whole reply. ``chat`` and ``responses`` carry vLLM's ``uuid`` and cache-only
references (vLLM's Responses endpoint hands ``input_image`` parts to its chat parser, which reads
them); Anthropic Messages has no place for one, so a Messages client sends every image with its
data, as an unmodified client of that API does (``mmgate serve --reuse auto`` then strips the
repeats on the engine side). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from mmgate.bench.dataset import Turn
from mmgate.bench.errors import BenchError
from mmgate.bench.planner import PlannedImage

Api = Literal["chat", "responses", "messages"]
API_PATHS: dict[str, str] = {
    "chat": "/v1/chat/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
}
# Anthropic's Messages API requires max_tokens; used when neither the run nor the turn sets one.
MESSAGES_DEFAULT_MAX_TOKENS = 1024

Exchange = tuple[Turn, str | None]
"""A turn already sent in this conversation and the assistant's reply (None: it failed)."""


def _split(history: Sequence[Exchange], turn: Turn, plan: Sequence[PlannedImage]) -> list[tuple[Turn, Sequence[PlannedImage], str | None]]:
    """(turn, its planned images, the reply that followed) for history then the current turn."""
    out: list[tuple[Turn, Sequence[PlannedImage], str | None]] = []
    pos = 0
    for past, reply in history:
        n = len(past.images)
        out.append((past, plan[pos:pos + n], reply))
        pos += n
    out.append((turn, plan[pos:pos + len(turn.images)], None))
    return out


def _data_url_source(url: str) -> dict[str, str]:
    """An Anthropic image source for ``url``: base64 for a ``data:`` URL, else a url source."""
    if not url.startswith("data:"):
        return {"type": "url", "url": url}
    head, sep, data = url.partition(",")
    if not sep or not head.endswith(";base64"):
        raise BenchError(f"cannot send a non-base64 data: URL as an Anthropic image ({head[:40]!r})")
    return {"type": "base64", "media_type": head[5:-7], "data": data}


def _whole_image(image: PlannedImage, api: str) -> str:
    if image.url is None:
        raise BenchError(f"the {api} API has no cache-only image references (use --api chat for --uuid-and-strip)")
    return image.url


def _input_image(image: PlannedImage) -> dict[str, Any]:
    """A Responses ``input_image`` part: with data (and its uuid), or a cache-only reference."""
    part: dict[str, Any] = {"type": "input_image", "image_url": image.url, "detail": "auto"}
    if image.uuid is not None:
        part["uuid"] = image.uuid
    return part


def responses_input(
    history: Sequence[Exchange], turn: Turn, plan: Sequence[PlannedImage]
) -> list[dict[str, Any]]:
    """The Responses ``input`` items: each user turn a message of ``input_text``/``input_image``
    parts, each earlier reply an assistant message."""
    items: list[dict[str, Any]] = []
    for t, images, reply in _split(history, turn, plan):
        content: list[dict[str, Any]] = [{"type": "input_text", "text": x} for x in t.texts]
        content.extend(_input_image(i) for i in images)
        items.append({"role": t.role, "content": content})
        if reply is not None:
            items.append({"role": "assistant", "content": reply})
    return items


def messages_list(history: Sequence[Exchange], turn: Turn, plan: Sequence[PlannedImage]) -> list[dict[str, Any]]:
    """The Anthropic ``messages``: each user turn its image blocks then its text blocks (the order
    Anthropic recommends), each earlier reply an assistant message."""
    messages: list[dict[str, Any]] = []
    for t, images, reply in _split(history, turn, plan):
        content: list[dict[str, Any]] = [
            {"type": "image", "source": _data_url_source(_whole_image(i, "messages"))} for i in images
        ]
        content.extend({"type": "text", "text": x} for x in t.texts)
        messages.append({"role": t.role, "content": content})
        if reply is not None:
            messages.append({"role": "assistant", "content": reply})
    return messages


def responses_body(
    model: str, stream: bool, max_tokens: int | None, system_prompt: str | None,
    history: Sequence[Exchange], turn: Turn, plan: Sequence[PlannedImage],
) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "input": responses_input(history, turn, plan), "stream": stream}
    if system_prompt is not None:
        body["instructions"] = system_prompt
    if max_tokens is not None:
        body["max_output_tokens"] = max_tokens
    return body


def messages_body(
    model: str, stream: bool, max_tokens: int | None, system_prompt: str | None,
    history: Sequence[Exchange], turn: Turn, plan: Sequence[PlannedImage],
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model, "messages": messages_list(history, turn, plan), "stream": stream,
        "max_tokens": max_tokens if max_tokens is not None else MESSAGES_DEFAULT_MAX_TOKENS,
    }
    if system_prompt is not None:
        body["system"] = system_prompt
    return body


def whole_reply(api: str, body: Any) -> tuple[str, int | None]:
    """(text, output tokens or None) of a non-streamed reply; ``ValueError`` when it is not one."""
    if not isinstance(body, dict):
        raise ValueError("reply is not a JSON object")
    usage = body.get("usage")
    if api == "chat":
        text = body["choices"][0]["message"].get("content") or ""
        key = "completion_tokens"
    elif api == "messages":
        text = "".join(b.get("text", "") for b in body["content"] if isinstance(b, dict) and b.get("type") == "text")
        key = "output_tokens"
    else:
        text = "".join(
            p.get("text", "")
            for item in body["output"] if isinstance(item, dict) and item.get("type") == "message"
            for p in item.get("content") or () if isinstance(p, dict) and p.get("type") == "output_text"
        )
        key = "output_tokens"
    tokens = usage.get(key) if isinstance(usage, dict) else None
    return str(text), tokens if isinstance(tokens, int) else None
