"""Content parts: classified the way vLLM's chat parser classifies them, then rebuilt or refused.

The reference is vLLM 0.32's ``vllm/renderers/chat_utils.py``
(``_parse_chat_message_content_mm_part`` and ``_parse_chat_message_content_part``). Its rule:

* a part whose ``type`` is a known part type and that has no ``uuid`` is read by its type;
* a part with a ``uuid`` — or with no ``type`` — is read by the FIRST media key it carries, in the
  order of ``KEY_ORDER`` below, whatever its ``type`` says (``{"type": "text", "image_url": …,
  "uuid": …}`` is an image to vLLM);
* a plain string in a content array is text.

vLLM acts on these media shapes: ``image_url`` / ``input_image`` (fetches the URL, honours the
uuid), ``image_pil`` (a Python object; ``null`` + uuid is a cache reference), ``image_embeds`` /
``audio_embeds`` / ``video_embeds`` / ``prompt_embeds`` (tensors, deserialised), ``audio_url`` /
``video_url`` (fetched; string or ``{"url"}``), ``input_audio`` (inline data; the uuid is honoured).

mmgate never forwards a media part as it came. Each one is, here:

* an image (``image_url`` by type or key, ``input_image``): an ``ImageSpec`` (url?, uuid?) that the
  gateway loads through the URL policy and re-sends as ``{"type": "image_url", …, "uuid": K}``;
* ``audio_url`` / ``video_url``: a ``PassthroughSpec`` whose URL the gateway checks with the URL
  policy (the backend fetches it), rebuilt as ``{"type": kind, kind: {"url": checked}}``; its uuid
  is namespaced like an image's (``mmgate.reuse.videos``), and with it the URL may be left out (a
  cache-only reference);
* ``input_audio``: a ``PassthroughSpec`` too, its ``data`` and ``format`` held as the URL vLLM reads
  them as (``data:audio/<format>;base64,<data>``, ``mmgate.media.audio``), rebuilt as
  ``{"type": "input_audio", "input_audio": {"data", "format"}}``; with a uuid it may be ``null``;
* ``image_pil``, every ``*_embeds``: refused (400) — they cannot be policed or namespaced.

A text part (``text``, ``input_text``, ``output_text``, ``refusal``, ``thinking``) or a
``tool_reference`` is forwarded unchanged only when vLLM reads it as exactly that: no uuid, no
media key. Any other ``type`` is refused. Pure logic: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from mmgate.errors import InvalidRequestError
from mmgate.media.audio import audio_data_url

# vLLM's key order when it classifies a part by its keys (uuid present or no type).
KEY_ORDER: tuple[str, ...] = (
    "image_url", "image_pil", "image_embeds", "audio_embeds", "video_embeds", "prompt_embeds",
    "audio_url", "input_audio", "video_url", "tool_reference",
)
TEXT_TYPES = frozenset({"text", "input_text", "output_text", "refusal", "thinking"})
IMAGE_TYPES = frozenset({"image_url", "input_image"})
PASSTHROUGH_TYPES = frozenset({"audio_url", "video_url"})
EMBEDS_TYPES = frozenset({"image_embeds", "audio_embeds", "video_embeds", "prompt_embeds"})
# Every part type vLLM's MM_PARSER_MAP knows.
KNOWN_TYPES = (
    TEXT_TYPES | IMAGE_TYPES | PASSTHROUGH_TYPES | EMBEDS_TYPES
    | {"image_pil", "input_audio", "tool_reference"}
)
# Keys that make vLLM treat a part as media (its _MEDIA_CONTENT_PART_KEYS).
MEDIA_KEYS = frozenset(KNOWN_TYPES - TEXT_TYPES - {"tool_reference"})
_DETAILS = frozenset({"auto", "low", "high", "original"})  # openai's ImageDetail, which vLLM validates
_AUDIO_FORMAT = re.compile(r"[A-Za-z0-9]{1,16}")


@dataclass(frozen=True, slots=True)
class ImageSpec:
    """An image part: what to load (``url``) and/or the client's label (``uuid``)."""

    url: str | None
    uuid: str | None
    detail: str | None


@dataclass(frozen=True, slots=True)
class PassthroughSpec:
    """An ``audio_url``/``video_url``/``input_audio`` part: the backend fetches ``url`` (an
    ``input_audio``'s data URL) once the gateway checked it. It may carry a ``uuid`` (vLLM caches the
    processed media under it), and then need no URL: a uuid-only reference (``url`` None)."""

    kind: str
    url: str | None
    uuid: str | None = None


@dataclass(frozen=True, slots=True)
class KeptPart:
    """A part forwarded as it came (text, tool_reference)."""

    part: Any


PartSpec = ImageSpec | PassthroughSpec | KeptPart


def classify(part: dict[str, Any]) -> str:
    """The part type vLLM would act on for ``part`` (vLLM's own rule, module docstring).

    Returns a type name; a part vLLM reads by its keys yields the key's name. Raises
    ``InvalidRequestError`` (no param: the caller adds it) for a part vLLM could not read either.
    """
    ptype = part.get("type")
    uuid = part.get("uuid")
    if isinstance(ptype, str) and ptype in KNOWN_TYPES and uuid is None:
        return ptype
    if ptype is None or uuid is not None:
        for key in KEY_ORDER:
            if key in part:
                return key
        if isinstance(ptype, str) and ptype in IMAGE_TYPES:
            # vLLM refuses a uuid part without an image_url key; the gateway reads it as the
            # cache-only reference docs/ARCHITECTURE.md lists (and sends it in the form vLLM reads).
            return "image_url"
        if ptype is None:
            raise InvalidRequestError("content part has no 'type' and no media key")
        if not isinstance(ptype, str):
            raise InvalidRequestError("content part 'type' must be a string")
        raise InvalidRequestError(f"'uuid' on a {ptype!r} part: only image parts carry a uuid")
    if not isinstance(ptype, str):
        raise InvalidRequestError("content part 'type' must be a string")
    raise InvalidRequestError(
        f"unsupported content part type {ptype[:64]!r} (supported: {', '.join(sorted(KNOWN_TYPES - {'image_pil'} - EMBEDS_TYPES))})"
    )


def parse_part(part: Any, *, max_uuid_length: int, require_detail: bool = True) -> PartSpec:
    """Classify one content part and check it; raises ``InvalidRequestError`` without a param.

    A part read by its ``type`` must also have the shape vLLM validates for that type (module
    docstring); ``require_detail``: an ``input_image`` needs its ``detail``, as in chat and in a
    Responses tool output (a Responses message item's image does not: vLLM fills it in).
    """
    if isinstance(part, str):
        return KeptPart(part)
    if not isinstance(part, dict):
        raise InvalidRequestError("each content part must be an object or a string")
    kind = classify(part)
    typed = part.get("uuid") is None and part.get("type") is not None  # read by its type
    media = [k for k in MEDIA_KEYS if k in part]
    if kind in TEXT_TYPES or kind == "tool_reference":
        if part.get("uuid") is not None and kind == "tool_reference" and not media:
            # Read by its key (vLLM ignores the uuid on it): the same reference, without the uuid.
            return KeptPart({"type": "tool_reference", "name": part.get("name")})
        if part.get("uuid") is not None:
            raise InvalidRequestError(f"'uuid' on a {kind!r} part: only image parts carry a uuid")
        if media:
            raise InvalidRequestError(
                f"a {kind!r} part must not carry media keys ({', '.join(sorted(media))}): "
                "send media in a part of its own"
            )
        return KeptPart(part)
    others = [k for k in media if k != kind and not (kind == "input_image" and k == "image_url")]
    if others:
        raise InvalidRequestError(
            f"a {kind} part must not also carry {', '.join(sorted(others))}: send one medium per part"
        )
    if kind == "image_pil":
        raise InvalidRequestError(
            "'image_pil' parts are not supported: a PIL image object cannot travel over HTTP and its "
            "uuid cannot be policed; send the image as an image_url (http(s) or data: URL)"
        )
    if kind in EMBEDS_TYPES:
        raise InvalidRequestError(
            f"{kind!r} parts are not supported by mmgate: embeddings cannot be validated or "
            "namespaced by the gateway; send the media itself"
        )
    if kind in IMAGE_TYPES:
        image = _image(part, kind, max_uuid_length)
        if typed:
            _check_typed_shape(part, kind, require_detail=require_detail)
        return image
    if part.get("uuid") is not None:
        return _labelled(part, kind, max_uuid_length)
    if kind == "input_audio":
        return PassthroughSpec(kind=kind, url=_input_audio(part.get("input_audio")))
    url = _passthrough_url(part.get(kind), kind)
    if typed:
        _check_typed_shape(part, kind, require_detail=require_detail)
    return PassthroughSpec(kind=kind, url=url)


def _check_typed_shape(part: dict[str, Any], kind: str, *, require_detail: bool) -> None:
    """What vLLM's typed parsers (``TypeAdapter`` of openai's part types) refuse, refused with its
    400: a URL string where an object ``{"url"}`` is required, an ``input_image`` without its
    ``detail`` or with an object ``image_url``."""
    if kind in ("image_url", "video_url", "audio_url"):
        if not isinstance(part.get(kind), dict):
            raise InvalidRequestError(
                f"'{kind}' must be an object {{\"url\": \"…\"}} on a part of type {kind}, as vLLM requires; "
                "a bare URL string is read only on a part without 'type'")
    elif kind == "input_image":
        if require_detail and "detail" not in part:
            raise InvalidRequestError(
                "an 'input_image' part needs its 'detail' (auto, low, high or original): vLLM refuses it without")
        if part.get("image_url") is not None and not isinstance(part["image_url"], str):
            raise InvalidRequestError("an input_image's 'image_url' must be a URL string")


def check_uuid(value: Any, max_len: int, where: str) -> str:
    """A client uuid as the contract allows it: a non-empty string of at most ``max_len`` chars."""
    if not isinstance(value, str):
        raise InvalidRequestError(f"{where} must be a string")
    if not value:
        raise InvalidRequestError(f"{where} must not be empty")
    if len(value) > max_len:
        raise InvalidRequestError(f"{where} is longer than {max_len} characters")
    return value


def _image(part: dict[str, Any], kind: str, max_uuid_length: int) -> ImageSpec:
    if part.get("file_id") is not None:
        raise InvalidRequestError("'file_id' image inputs are not supported: send image_url")
    value = part.get("image_url")
    url: str | None = None
    nested: str | None = None
    detail = part.get("detail") if kind == "input_image" else None
    if isinstance(value, str):
        url = value or None
    elif isinstance(value, dict):
        raw_url = value.get("url")
        if raw_url is not None and not isinstance(raw_url, str):
            raise InvalidRequestError("'image_url.url' must be a string")
        url = raw_url or None
        if value.get("uuid") is not None:
            nested = check_uuid(value["uuid"], max_uuid_length, "'image_url.uuid'")
        detail = value.get("detail", detail)
    elif value is not None:
        raise InvalidRequestError("'image_url' must be an object with a 'url', a URL string, or null")
    if detail is not None and (not isinstance(detail, str) or detail not in _DETAILS):
        raise InvalidRequestError("'detail' must be one of auto, low, high, original")
    top: str | None = None
    if part.get("uuid") is not None:
        top = check_uuid(part["uuid"], max_uuid_length, "'uuid'")
    if top is not None and nested is not None and top != nested:
        raise InvalidRequestError(
            "'uuid' and the deprecated 'image_url.uuid' differ: send one (the top-level 'uuid')"
        )
    uuid = top if top is not None else nested
    if url is None and uuid is None:
        raise InvalidRequestError(
            "image part has neither 'image_url.url' nor a 'uuid' (a cache-only reference needs a uuid)"
        )
    return ImageSpec(url=url, uuid=uuid, detail=detail)


def _labelled(part: dict[str, Any], kind: str, max_uuid_length: int) -> PassthroughSpec:
    """A ``video_url``/``audio_url``/``input_audio`` part with a uuid (read by its key, as vLLM
    reads it): labelled media, or a uuid-only reference when it has none (``null``, ``{}``,
    ``{"url": ""}``; an ``input_audio`` without ``data``)."""
    uuid = check_uuid(part["uuid"], max_uuid_length, "'uuid'")
    value = part.get(kind)
    if kind == "input_audio":
        empty = value is None or (isinstance(value, dict) and not value.get("data"))
        return PassthroughSpec(kind=kind, url=None if empty else _input_audio(value), uuid=uuid)
    url = value.get("url") if isinstance(value, dict) else value
    if url is not None and not isinstance(url, str):
        raise InvalidRequestError(f"'{kind}.url' must be a string")
    if value is not None and not isinstance(value, dict | str):
        raise InvalidRequestError(f"'{kind}' must be an object with a 'url', a URL string, or null")
    return PassthroughSpec(kind=kind, url=url or None, uuid=uuid)


def _passthrough_url(value: Any, kind: str) -> str:
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str) or not url:
        raise InvalidRequestError(f"a {kind} part needs a URL: '{kind}': {{\"url\": \"…\"}}")
    return url


def _input_audio(value: Any) -> str:
    """An ``input_audio`` object checked, as the URL vLLM reads it as."""
    if not isinstance(value, dict):
        raise InvalidRequestError("'input_audio' must be an object with 'data' and 'format'")
    data, fmt = value.get("data"), value.get("format")
    if not isinstance(data, str) or not data:
        raise InvalidRequestError("'input_audio.data' must be a non-empty base64 string")
    if not isinstance(fmt, str) or not _AUDIO_FORMAT.fullmatch(fmt):
        raise InvalidRequestError("'input_audio.format' must be a short audio format name (wav, mp3, …)")
    return audio_data_url(data, fmt)
