"""Parse and validate a chat-completions request; every image part becomes an ``ImageSlot``.

Pure logic: no I/O, no event loop. The parsed body stays the client's own dict, so unknown
top-level fields (vLLM has many) are forwarded untouched. Content parts are not: each one is
classified the way vLLM reads it (``mmgate.api.content_parts``) and replaced by its canonical form, or the
request is refused; slots keep a reference to their canonical part so the gateway can fill it in
for the backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from mmgate.api.content_parts import ImageSpec, PassthroughSpec, parse_part
from mmgate.errors import InvalidRequestError
from mmgate.jsonbody import HeldText, loads_body, loads_bounded
from mmgate.media.audio import media_value
from mmgate.reuse import ImageSlot
from mmgate.reuse.videos import VideoRef

# Deepest JSON nesting accepted by default (``--max-json-depth``; orjson writes at most 254
# levels, real requests use < 10).
MAX_JSON_DEPTH = 64

@dataclass(slots=True)
class ChatRequest:
    """A validated chat-completions request."""

    body: dict[str, Any]
    model: str
    stream: bool
    slots: list[ImageSlot]
    passthrough: list[PassthroughSlot] = field(default_factory=list)
    # The video and audio parts with a uuid, once the gateway checked them (``mmgate.reuse.videos``).
    videos: list[VideoRef] = field(default_factory=list)
    # The size of the JSON it was parsed from (None: built, not parsed from the client's bytes).
    raw_bytes: int | None = None


@dataclass(slots=True)
class PassthroughSlot:
    """An ``audio_url``/``video_url``/``input_audio`` part the backend fetches or reads: its URL
    (an ``input_audio``'s data URL) must pass the URL policy first (``mmgate.media.passthrough``);
    ``part[kind]`` is then set to the checked one (``media_value``). Its ``uuid`` (namespaced before
    sending); without a ``url``, a cache-only reference."""

    param: str
    kind: str
    url: str | None
    part: dict[str, Any]
    uuid: str | None = None
    digest: str | None = None  # a data: video's or audio's SHA-256 (its content key), once checked


def parse_chat_request(
    raw: bytes | bytearray, *, max_images: int, max_uuid_length: int, max_depth: int = MAX_JSON_DEPTH
) -> ChatRequest:
    """Parse ``raw`` JSON; raise ``InvalidRequestError`` naming the offending field."""
    try:
        body = loads_bounded(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError(f"request body is not valid JSON: {exc}") from exc
    return _parsed(raw, body, max_images=max_images, max_uuid_length=max_uuid_length, max_depth=max_depth)


async def parse_chat_request_async(
    raw: bytes | bytearray, *, max_images: int, max_uuid_length: int, max_depth: int = MAX_JSON_DEPTH,
    held: HeldText | None = None,
) -> ChatRequest:
    """``parse_chat_request``, giving the event loop back while a very large body is parsed
    (``mmgate.jsonbody``; ``held``: texts it may repeat)."""
    try:
        body = await loads_body(raw, held)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError(f"request body is not valid JSON: {exc}") from exc
    return _parsed(raw, body, max_images=max_images, max_uuid_length=max_uuid_length, max_depth=max_depth)


def _parsed(raw: bytes | bytearray, body: Any, *, max_images: int, max_uuid_length: int,
            max_depth: int) -> ChatRequest:
    """``parse_chat_body`` of ``body``, decoded from ``raw``."""
    request = parse_chat_body(body, max_images=max_images, max_uuid_length=max_uuid_length, max_depth=max_depth,
                              shallow=_shallow(raw, max_depth))
    request.raw_bytes = len(raw)
    return request


# Bodies up to this size are scanned for brackets to skip the depth walk (``_shallow``); in larger
# ones (an image's base64) the scan costs more than the walk it would save.
_SHALLOW_SCAN_BYTES = 64 * 1024


def _shallow(raw: bytes | bytearray, max_depth: int) -> bool:
    """True when ``raw`` cannot nest deeper than ``max_depth``: it holds no more opening brackets
    (counted in C, strings included, so never fewer than its depth)."""
    return len(raw) <= _SHALLOW_SCAN_BYTES and raw.count(b"{") + raw.count(b"[") <= max_depth


def parse_chat_body(
    body: Any, *, max_images: int, max_uuid_length: int, max_depth: int, shallow: bool = False,
) -> ChatRequest:
    """Validate a parsed request body (see ``parse_chat_request``); ``shallow``: its text was
    found to nest no deeper than ``max_depth`` already (no walk needed)."""
    if not isinstance(body, dict):
        raise InvalidRequestError("request body must be a JSON object")
    if not shallow:
        check_depth(body, max_depth)
    model = body.get("model")
    if model is None:
        model = ""  # the gateway fills in the fleet's one model, as vLLM its served model
    elif not isinstance(model, str) or not model:
        raise InvalidRequestError("'model' must be a non-empty string", param="model")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InvalidRequestError("'stream' must be a boolean", param="stream")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("'messages' must be a non-empty array", param="messages")
    slots: list[ImageSlot] = []
    passthrough: list[PassthroughSlot] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequestError("each message must be an object", param=f"messages[{i}]")
        if not isinstance(message.get("role"), str):
            raise InvalidRequestError("each message needs a string 'role'", param=f"messages[{i}].role")
        content = message.get("content")
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise InvalidRequestError(
                "'content' must be a string or an array of parts", param=f"messages[{i}].content"
            )
        for j, part in enumerate(content):
            param = f"messages[{i}].content[{j}]"
            try:
                spec = parse_part(part, max_uuid_length=max_uuid_length)
            except InvalidRequestError as exc:
                exc.param = param
                raise
            if isinstance(spec, ImageSpec):
                canonical = _image_part(spec)
                content[j] = canonical
                slots.append(ImageSlot(index=len(slots), param=param, part=canonical, url=spec.url, uuid=spec.uuid))
                if len(slots) > max_images:
                    raise InvalidRequestError(
                        f"too many images: at most {max_images} per request", param=param
                    )
            elif isinstance(spec, PassthroughSpec):
                canonical = {"type": spec.kind, spec.kind: media_value(spec.kind, spec.url) if spec.url else None}
                content[j] = canonical
                passthrough.append(PassthroughSlot(param, spec.kind, spec.url, canonical, spec.uuid))
            else:
                content[j] = spec.part
    return ChatRequest(body=body, model=model, stream=stream, slots=slots, passthrough=passthrough)


def _image_part(spec: ImageSpec) -> dict[str, Any]:
    """The canonical image part (``render`` fills ``image_url`` and ``uuid`` for the backend)."""
    return {"type": "image_url", "image_url": {"detail": spec.detail} if spec.detail is not None else None}


def check_depth(node: Any, limit: int) -> None:
    """Refuse JSON nested deeper than ``limit`` (400): it could not be forwarded, and no chat
    request needs it. Iterative, one visit per container."""
    stack: list[tuple[Any, int]] = [(node, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            raise InvalidRequestError(f"the request nests JSON deeper than {limit} levels (--max-json-depth)")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values() if isinstance(v, dict | list))
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item if isinstance(v, dict | list))
