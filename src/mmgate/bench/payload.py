"""Build the body of one request: messages, image parts, sampling fields — in Chat Completions'
shape, or in the Responses or Anthropic Messages shape (``mmgate.bench.apis``) for those clients.

``render_messages`` is pure: it lays a planned list of image parts over the turns of the request
(the accumulated history of a multi-turn conversation, then the current turn). ``build_request``
resolves the images, asks the session's strip planner which carry data, and serialises with orjson.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from mmgate.bench.apis import Api, Exchange, messages_body, responses_body
from mmgate.bench.dataset import Turn
from mmgate.bench.images import DatasetImages
from mmgate.bench.planner import PlanCounts, PlannedImage, StripPlanner, count_plan

__all__ = ["BodyOptions", "BuiltRequest", "Exchange", "build_request", "render_messages", "request_body"]


@dataclass(frozen=True, slots=True)
class BodyOptions:
    """Request fields shared by every request of a run."""

    model: str
    stream: bool = True
    output_length: int | None = None
    extra_body: Mapping[str, Any] | None = None
    api: Api = "chat"


@dataclass(frozen=True, slots=True)
class BuiltRequest:
    """A serialised request and what its images amount to."""

    body: bytes
    plan: list[PlannedImage]
    counts: PlanCounts


def image_part(image: PlannedImage) -> dict[str, Any]:
    """vLLM's image (or video) part: with data, or a cache-only reference (``image_url`` /
    ``video_url`` null + uuid)."""
    kind = "video_url" if image.kind == "video" else "image_url"
    if image.url is None:
        return {"type": kind, kind: None, "uuid": image.uuid}
    part: dict[str, Any] = {"type": kind, kind: {"url": image.url}}
    if image.uuid is not None:
        part["uuid"] = image.uuid
    return part


def turn_message(turn: Turn, images: Sequence[PlannedImage]) -> dict[str, Any]:
    """The message of one turn: a plain string when it is one text, else text parts then images."""
    if not images and len(turn.texts) == 1:
        return {"role": turn.role, "content": turn.texts[0]}
    content: list[dict[str, Any]] = [{"type": "text", "text": t} for t in turn.texts]
    content.extend(image_part(i) for i in images)
    return {"role": turn.role, "content": content}


def render_messages(
    system_prompt: str | None, history: Sequence[Exchange], turn: Turn, plan: Sequence[PlannedImage]
) -> list[dict[str, Any]]:
    """Messages of a request; ``plan`` holds the image parts of history then turn, in order."""
    messages: list[dict[str, Any]] = []
    if system_prompt is not None:
        messages.append({"role": "system", "content": system_prompt})
    pos = 0
    for past, reply in history:
        n = len(past.images)
        messages.append(turn_message(past, plan[pos : pos + n]))
        pos += n
        if reply is not None:
            messages.append({"role": "assistant", "content": reply})
    messages.append(turn_message(turn, plan[pos : pos + len(turn.images)]))
    return messages


def request_body(options: BodyOptions, messages: list[dict[str, Any]], turn: Turn) -> dict[str, Any]:
    """The JSON body: model, messages, streaming, max_tokens, then ``extra`` fields on top."""
    body: dict[str, Any] = {"model": options.model, "messages": messages, "stream": options.stream}
    if options.stream:
        body["stream_options"] = {"include_usage": True}
    max_tokens = turn.output_length if turn.output_length is not None else options.output_length
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if options.extra_body:
        body.update(options.extra_body)
    if turn.extra:
        body.update(turn.extra)
    return body


def api_body(
    options: BodyOptions, system_prompt: str | None, history: Sequence[Exchange], turn: Turn,
    plan: Sequence[PlannedImage],
) -> dict[str, Any]:
    """The request body in the shape of ``options.api``, with the run's and the turn's extra fields."""
    if options.api == "chat":
        return request_body(options, render_messages(system_prompt, history, turn, plan), turn)
    max_tokens = turn.output_length if turn.output_length is not None else options.output_length
    build = responses_body if options.api == "responses" else messages_body
    body = build(options.model, options.stream, max_tokens, system_prompt, history, turn, plan)
    if options.extra_body:
        body.update(options.extra_body)
    if turn.extra:
        body.update(turn.extra)
    return body


async def build_request(
    options: BodyOptions,
    resolver: DatasetImages,
    planner: StripPlanner,
    system_prompt: str | None,
    history: Sequence[Exchange],
    turn: Turn,
) -> BuiltRequest:
    """Resolve, plan and serialise the next request of a session."""
    entries = [e for past, _ in history for e in past.images]
    entries.extend(turn.images)
    if entries:
        if len(entries) == 1:
            slots = [await resolver.slot(entries[0])]
        else:
            slots = list(await asyncio.gather(*(resolver.slot(e) for e in entries)))
        plan = planner.plan(slots)
    else:
        plan = []
    body = orjson.dumps(api_body(options, system_prompt, history, turn, plan))
    return BuiltRequest(body, plan, count_plan(plan))
