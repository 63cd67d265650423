"""The URL policy on every media field of a passthrough request body, before any backend sees it.

A forwarded body goes to the backend as it came, except for its media: vLLM fetches or decodes
media wherever it reads chat-style content parts — ``messages`` on ``/tokenize`` and
``/classify``, batched ``messages`` and chat ``input`` on ``/v1/embeddings`` and ``/pooling``,
multimodal ``data_1``/``data_2``/``queries``/``documents`` content on ``/score`` and ``/rerank`` —
and it deserialises tensors (``prompt_embeds`` on ``/v1/completions``, ``*_embeds`` parts).

``media_fields`` finds every object that carries a media key (``mmgate.api.content_parts.MEDIA_KEYS``) or a
media part ``type``, wherever it is nested, and ``police`` classifies each with the chat parser
(``parse_part``, vLLM's own rule) and then:

* an image (``image_url``/``input_image``): its URL passes the URL policy (the backend fetches it;
  ``data:`` URLs pass) and the part is rebuilt as ``{"type": "image_url", "image_url": {"url"}}``.
  A client ``uuid`` is dropped — a backend uuid is the gateway's, namespaced by tenant, and an
  unnamespaced one could reach another tenant's image — and a uuid without a URL (a cache-only
  reference) is refused: these endpoints carry no reuse;
* ``audio_url``/``video_url``/``input_audio``: the URL (an ``input_audio``'s data) passes the
  policy, the part is rebuilt; a ``data:`` video's or audio's container is checked first
  (``mmgate.media.video``, ``mmgate.media.audio``, under the operator's limits); a uuid is dropped
  and a uuid-only reference refused, as an image's;
* ``image_pil``, ``*_embeds``, ``prompt_embeds``, a part vLLM could not read: refused (400 naming
  the field);
* ``multi_modal_data`` anywhere (vLLM takes raw media or tensors from it on ``/v1/completions``
  prompts): refused, naming where.

A body without media costs one scan of its bytes (``may_carry_media``), no walk.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from mmgate.api.content_parts import (
    KNOWN_TYPES,
    MEDIA_KEYS,
    TEXT_TYPES,
    ImageSpec,
    KeptPart,
    PassthroughSpec,
    parse_part,
)
from mmgate.config import MediaSettings
from mmgate.errors import InvalidRequestError
from mmgate.media.audio import check_data_media, media_value
from mmgate.media.dataurl import is_data_url

# Byte strings one of which any JSON that names a media key or part type holds (an escaped key,
# ``\\u0069mage_url``, holds a backslash-u: scanned too).
_SNIFF = (b"_url", b"embeds", b"input_audio", b"input_image", b"image_pil", b"multi_modal_data", b"\\u")
# Keys whose value vLLM reads as media the gateway cannot police: refused wherever they are.
REFUSED_KEYS = frozenset({"multi_modal_data"})
_MEDIA_TYPES = KNOWN_TYPES - TEXT_TYPES - {"tool_reference"}
# Top-level fields that hold JSON schemas or template/processor options, never content parts: not
# walked (a schema property named ``image_url`` is not an image).
_NOT_CONTENT = frozenset({
    "tools", "tool_choice", "response_format", "structured_outputs", "guided_json", "json_schema",
    "chat_template_kwargs", "mm_processor_kwargs", "media_io_kwargs", "vllm_xargs", "logit_bias",
})
CheckURL = Callable[[str, str, str], Awaitable[str]]  # (url, param, kind) -> the URL to forward


def refused_key(key: str, param: str) -> InvalidRequestError:
    """The 400 for a ``REFUSED_KEYS`` key found at ``param``."""
    return InvalidRequestError(f"'{key}' is not accepted through mmgate: the gateway cannot police the media in "
                               "it; send a chat request (messages with image_url parts) instead", param=param)


# vLLM's disaggregated-serving fields: with a KV (or encoder-cache) connector, a replica connects to
# the host they name and pulls cache blocks by id, whoever sent them (``--allow-transfer-params``).
TRANSFER_FIELDS = ("kv_transfer_params", "ec_transfer_params")


def refuse_transfer_params(body: dict[str, Any], allowed: bool) -> None:
    """400 naming a ``TRANSFER_FIELDS`` field of ``body`` unless the operator allows them."""
    if allowed:
        return
    for field in TRANSFER_FIELDS:
        if field in body:
            raise InvalidRequestError(
                f"'{field}' is not accepted from clients: it tells a disaggregated vLLM which host to "
                "pull cache blocks from; an operator whose clients are a trusted prefill/decode proxy "
                "allows it with --allow-transfer-params", param=field)


def may_carry_media(raw: bytes) -> bool:
    """False when ``raw`` cannot name a media field: the walk is skipped."""
    return any(s in raw for s in _SNIFF)


def media_fields(body: Any, max_depth: int) -> list[tuple[str, dict[str, Any], Any, Any]]:
    """Every object carrying media in ``body``: (its param path, its container, its key or index
    in the container, the object). The body itself comes with container and key None.
    Refuses nesting deeper than ``max_depth`` (400)."""
    found: list[tuple[str, dict[str, Any], Any, Any]] = []
    stack: list[tuple[Any, str, Any, Any, int]] = [(body, "", None, None, 1)]
    while stack:
        node, path, container, key, depth = stack.pop()
        if depth > max_depth:
            raise InvalidRequestError(f"the request nests JSON deeper than {max_depth} levels (--max-json-depth)")
        if isinstance(node, dict):
            refused = REFUSED_KEYS.intersection(node)
            if refused:
                key = min(refused)
                raise refused_key(key, f"{path}.{key}" if path else key)
            ptype = node.get("type")
            if not MEDIA_KEYS.isdisjoint(node) or (isinstance(ptype, str) and ptype in _MEDIA_TYPES):
                found.append((path, container, key, node))
                continue
            for k, v in node.items():
                if isinstance(v, dict | list) and not (depth == 1 and k in _NOT_CONTENT):
                    stack.append((v, f"{path}.{k}" if path else str(k), node, k, depth + 1))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                if isinstance(v, dict | list):
                    stack.append((v, f"{path}[{i}]", node, i, depth + 1))
    return found


async def police(body: Any, check_url: CheckURL, *, max_uuid_length: int, max_depth: int,
                 media: MediaSettings | None = None) -> bool:
    """Police every media field of ``body`` in place (module docstring); True when it changed.
    ``media``: the operator's limits on ``data:`` video and audio (None: the defaults)."""
    changed = False
    for param, container, key, part in media_fields(body, max_depth):
        if container is None:
            # The body itself carries a media key (``prompt_embeds`` on /v1/completions).
            keys = sorted(k for k in part if k in MEDIA_KEYS)
            raise InvalidRequestError(
                f"'{keys[0]}' is not accepted through mmgate: the gateway cannot validate it; send the "
                "media itself", param=keys[0])
        try:
            spec = parse_part(part, max_uuid_length=max_uuid_length)
        except InvalidRequestError as exc:
            exc.param = param
            raise
        if isinstance(spec, ImageSpec):
            if spec.url is None:
                raise InvalidRequestError(
                    "a cache-only image reference (a uuid without a url) is not accepted on this endpoint: "
                    "send the image's url", param=param)
            url = await check_url(spec.url, param, "image_url")
            image: dict[str, Any] = {"url": url}
            if spec.detail is not None:
                image["detail"] = spec.detail
            container[key] = {"type": "image_url", "image_url": image}
        elif isinstance(spec, PassthroughSpec):
            if spec.url is None:
                raise InvalidRequestError(
                    f"a cache-only {spec.kind} reference (a uuid without its media) is not accepted on this "
                    f"endpoint: send the {spec.kind}", param=param)
            # A video's or audio's uuid is dropped, as an image's: these endpoints carry no reuse.
            checked = await check_url(spec.url, param, spec.kind)
            container[key] = {"type": spec.kind, spec.kind: media_value(spec.kind, checked)}
            if is_data_url(spec.url):  # its container, as on chat
                await check_data_media(spec.kind, spec.url, max_bytes=len(spec.url), param=param,
                                       media=media or MediaSettings())
        elif isinstance(spec, KeptPart):
            container[key] = spec.part
        changed = True
    return changed
