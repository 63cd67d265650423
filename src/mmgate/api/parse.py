"""Parse and validate a chat-completions request; every image part becomes an ``ImageSlot``.

Pure logic: no I/O, no event loop. The parsed body stays the client's own dict, so unknown fields
(vLLM has many) are forwarded untouched; slots keep a reference to their part so the gateway can
rewrite it in place for the backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from mmgate.errors import InvalidRequestError
from mmgate.reuse import ImageSlot

IMAGE_PART = "image_url"
NON_IMAGE_MEDIA_PARTS = frozenset({"input_audio", "audio_url", "video_url"})


@dataclass(slots=True)
class ChatRequest:
    """A validated chat-completions request."""

    body: dict[str, Any]
    model: str
    stream: bool
    slots: list[ImageSlot]


def parse_chat_request(raw: bytes, *, max_images: int, max_uuid_length: int) -> ChatRequest:
    """Parse ``raw`` JSON; raise ``InvalidRequestError`` naming the offending field."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidRequestError("request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("'model' is required and must be a non-empty string", param="model")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InvalidRequestError("'stream' must be a boolean", param="stream")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("'messages' must be a non-empty array", param="messages")
    slots: list[ImageSlot] = []
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
            if not isinstance(part, dict):
                raise InvalidRequestError("each content part must be an object", param=param)
            ptype = part.get("type")
            if not isinstance(ptype, str):
                raise InvalidRequestError("each content part needs a string 'type'", param=param)
            if ptype == IMAGE_PART:
                slots.append(_image_slot(part, len(slots), param, max_uuid_length))
                if len(slots) > max_images:
                    raise InvalidRequestError(
                        f"too many images: at most {max_images} per request", param=param
                    )
            elif ptype in NON_IMAGE_MEDIA_PARTS and "uuid" in part:
                raise InvalidRequestError(
                    f"'uuid' on a {ptype} part: UUID reuse is for images only", param=param
                )
    return ChatRequest(body=body, model=model, stream=stream, slots=slots)


def _check_uuid(value: Any, param: str, max_len: int, where: str) -> str:
    if not isinstance(value, str):
        raise InvalidRequestError(f"{where} must be a string", param=param)
    if not value:
        raise InvalidRequestError(f"{where} must not be empty", param=param)
    if len(value) > max_len:
        raise InvalidRequestError(f"{where} is longer than {max_len} characters", param=param)
    return value


def _image_slot(part: dict[str, Any], index: int, param: str, max_uuid_length: int) -> ImageSlot:
    image_url = part.get("image_url")
    url: str | None = None
    nested: str | None = None
    if isinstance(image_url, dict):
        raw_url = image_url.get("url")
        if raw_url is not None and not isinstance(raw_url, str):
            raise InvalidRequestError("'image_url.url' must be a string", param=param)
        url = raw_url or None
        if image_url.get("uuid") is not None:
            nested = _check_uuid(image_url["uuid"], param, max_uuid_length, "'image_url.uuid'")
    elif image_url is not None:
        raise InvalidRequestError("'image_url' must be an object with a 'url', or null", param=param)
    top: str | None = None
    if part.get("uuid") is not None:
        top = _check_uuid(part["uuid"], param, max_uuid_length, "'uuid'")
    if top is not None and nested is not None and top != nested:
        raise InvalidRequestError(
            "'uuid' and the deprecated 'image_url.uuid' differ: send one (the top-level 'uuid')", param=param
        )
    uuid = top if top is not None else nested
    if url is None and uuid is None:
        raise InvalidRequestError(
            "image part has neither 'image_url.url' nor a 'uuid' (a cache-only reference needs a uuid)",
            param=param,
        )
    return ImageSlot(index=index, param=param, part=part, url=url, uuid=uuid)
