"""Parse and validate a Chat Completions request the way vLLM's OpenAI server does (pure logic).

Unknown fields are ignored (sampling knobs such as ``temperature`` have no effect on the sim).
``tools`` are checked as vLLM checks them (``check_tools``), but the sim calls no tool: where vLLM
would run its parser (``--enable-auto-tool-choice``, ``--tool-call-parser``) the answer is text, as
from a model that called none (for ``required`` or a named function vLLM would force a call).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mmgate.sim.config import SimSettings
from mmgate.sim.errors import InvalidRequestError, ModelNotFoundError

TEXT_PART_TYPES = frozenset({"text", "input_text", "refusal"})
IMAGE_PART_TYPES = frozenset({"image_url", "input_image"})
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


@dataclass(frozen=True, slots=True)
class ImageRef:
    """One image of the request, in order. ``url`` None: a cache-only reference to ``uuid``."""

    index: int
    url: str | None
    uuid: str | None
    param: str

    @property
    def is_cache_only(self) -> bool:
        return self.url is None


@dataclass(frozen=True, slots=True)
class SimRequest:
    """The parts of a chat request the sim acts on."""

    model: str
    texts: tuple[str, ...]
    num_messages: int
    images: tuple[ImageRef, ...]
    # Per message, its role and the UTF-8 bytes of its text (for byte-level token counts).
    roles: tuple[str, ...]
    text_bytes: tuple[int, ...]
    n: int
    stream: bool
    include_usage: bool
    continuous_usage_stats: bool
    max_tokens: int | None
    min_tokens: int
    ignore_eos: bool
    stop: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


def not_found(model: str, served: str) -> ModelNotFoundError:
    return ModelNotFoundError(f"The model `{model}` does not exist. Valid aliases: {served}.", param="model")


def with_param(message: str, param: str, value: Any = None) -> str:
    """vLLM 0.32 appends the parameter (and its value) to a validation message."""
    tail = f"parameter={param}" + (f", value={value}" if value is not None else "")
    return f"{message} ({tail})"


def parse_sim_request(body: Any, settings: SimSettings) -> SimRequest:
    """Validate a decoded JSON body; raise InvalidRequestError / ModelNotFoundError."""
    if not isinstance(body, dict):
        raise InvalidRequestError("The request body must be a JSON object.")
    model = body.get("model")
    if model is None:
        model = settings.model
    if not isinstance(model, str):
        raise InvalidRequestError("'model' must be a string.", param="model")
    if model != settings.model:
        raise not_found(model, settings.model)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("'messages' must be a non-empty list.", param="messages")
    check_tools(body, settings)
    texts: list[str] = []
    images: list[ImageRef] = []
    roles: list[str] = []
    text_bytes: list[int] = []
    for m_idx, message in enumerate(messages):
        first_text = len(texts)
        roles.append(_parse_message(message, m_idx, texts, images))
        text_bytes.append(sum(len(t.encode("utf-8", "surrogatepass")) for t in texts[first_text:]))
    if len(images) > settings.max_images_per_request:
        raise InvalidRequestError(
            with_param(f"At most {settings.max_images_per_request} image(s) may be provided in one prompt.",
                       "image"),
            param="image",
        )
    n = body.get("n")
    if n is None:
        n = 1
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidRequestError(with_param("n must be at least 1", "n", n), param="n")
    stream = _opt_bool(body, "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise InvalidRequestError("'stream_options' must be an object.", param="stream_options")
    if options and not stream:
        raise InvalidRequestError("Stream options can only be defined when `stream=True`.",
                                  param="stream_options")
    max_tokens = _opt_int(body, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = _opt_int(body, "max_tokens")
    if max_tokens is not None and max_tokens < 1:
        raise InvalidRequestError(f"max_tokens must be at least 1, got {max_tokens}.", param="max_tokens")
    min_tokens = _opt_int(body, "min_tokens") or 0
    if min_tokens < 0:
        raise InvalidRequestError(f"min_tokens must be greater than or equal to 0, got {min_tokens}.",
                                  param="min_tokens")
    if max_tokens is not None and min_tokens > max_tokens:
        raise InvalidRequestError(
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.",
            param="min_tokens",
        )
    if body.get("thinking_token_budget") is not None and settings.reasoning_parser is None:
        raise InvalidRequestError(  # vLLM 0.32's input processor, in its words
            "thinking_token_budget is set but reasoning_config is not configured. Please set --reasoning-parser "
            "and/or --reasoning-config to use thinking_token_budget.")
    return SimRequest(
        model=model,
        texts=tuple(texts),
        num_messages=len(messages),
        images=tuple(images),
        roles=tuple(roles),
        text_bytes=tuple(text_bytes),
        n=n,
        stream=stream,
        include_usage=bool(options.get("include_usage")),
        continuous_usage_stats=bool(options.get("continuous_usage_stats")),
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=_opt_bool(body, "ignore_eos"),
        stop=_stop(body),
    )


def check_tools(body: dict[str, Any], settings: SimSettings) -> None:
    """vLLM 0.32's checks of ``tools`` and ``tool_choice`` on chat: its request model's (a choice
    needs tools; a named one must be among them), then its renderer's (what it cannot parse)."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if choice is not None and choice != "none" and not tools:
        raise InvalidRequestError(with_param("When using `tool_choice`, `tools` must be set.", "tool_choice"),
                                  param="tool_choice")
    if not tools:
        return
    if not isinstance(tools, list):
        raise InvalidRequestError("'tools' must be a list.", param="tools")
    if choice is None:
        choice = "auto"
    if isinstance(choice, dict):
        named = choice.get("function")
        name = named.get("name") if isinstance(named, dict) else None
        functions = [t.get("function") for t in tools if isinstance(t, dict)]
        if not isinstance(name, str) or name not in [f.get("name") for f in functions if isinstance(f, dict)]:
            raise InvalidRequestError(with_param("The tool specified in `tool_choice` does not match any of the "
                                                 "specified `tools`", "tool_choice"), param="tool_choice")
        wanted = f'function "{name}"'
    elif choice in ("none", "auto", "required"):
        wanted = f'"{choice}"'
    else:
        raise InvalidRequestError("'tool_choice' must be 'none', 'auto', 'required' or a named function.",
                                  param="tool_choice")
    if choice == "auto" and not settings.enable_auto_tool_choice:
        raise InvalidRequestError('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
                                  "to be set")
    if choice not in ("none", "auto") and settings.tool_call_parser is None:
        raise InvalidRequestError(f"tool_choice={wanted} requires --tool-call-parser to be set")


def _parse_message(message: Any, m_idx: int, texts: list[str], images: list[ImageRef]) -> str:
    """Collect one message's texts and images; its role."""
    where = f"messages[{m_idx}]"
    if not isinstance(message, dict):
        raise InvalidRequestError(f"{where} must be an object.", param=where)
    role = message.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise InvalidRequestError(f"{where}.role must be one of {sorted(ROLES)}, got {role!r}.",
                                  param=f"{where}.role")
    content = message.get("content")
    if content is None:
        return role  # an assistant turn with tool_calls only
    if isinstance(content, str):
        texts.append(content)
        return role
    if not isinstance(content, list):
        raise InvalidRequestError(f"{where}.content must be a string or a list of parts.",
                                  param=f"{where}.content")
    for p_idx, part in enumerate(content):
        _parse_part(part, f"{where}.content[{p_idx}]", texts, images)
    return role


def _parse_part(part: Any, where: str, texts: list[str], images: list[ImageRef]) -> None:
    if isinstance(part, str):
        texts.append(part)
        return
    if not isinstance(part, dict):
        raise InvalidRequestError(f"{where} must be an object.", param=where)
    kind = part.get("type")
    if not isinstance(kind, str):
        raise InvalidRequestError(f"{where}.type must be a string.", param=where)
    if kind in TEXT_PART_TYPES:
        text = part.get(kind if kind != "input_text" else "text")
        if not isinstance(text, str):
            raise InvalidRequestError(f"{where}.{kind} must be a string.", param=where)
        texts.append(text)
        return
    if kind in IMAGE_PART_TYPES:
        images.append(_parse_image(part, where, len(images)))
        return
    raise InvalidRequestError(
        f"Unsupported content part type {kind!r}: the sim (a vLLM stand-in serving a "
        "vision-language model) accepts text and image_url parts.",
        param=where,
    )


def _parse_image(part: dict[str, Any], where: str, index: int) -> ImageRef:
    if part.get("type") == "image_url" and "image_url" not in part:
        # vLLM 0.32's parser, word for word, for an image_url part without the key.
        raise InvalidRequestError(with_param("Missing 'type' field in multimodal part.", "type"), param="type")
    raw = part.get("image_url")
    url: str | None = None
    nested_uuid: Any = None
    if isinstance(raw, str):
        url = raw
    elif isinstance(raw, dict):
        value = raw.get("url")
        if value is not None and not isinstance(value, str):
            raise InvalidRequestError(f"{where}.image_url.url must be a string.", param=where)
        url = value
        nested_uuid = raw.get("uuid")
    elif raw is not None:
        raise InvalidRequestError(f"{where}.image_url must be an object.", param=where)
    uuid = part.get("uuid")
    if uuid is None:
        uuid = nested_uuid
    # vLLM takes any string as a uuid, "" included (a cache key like any other).
    if uuid is not None and not isinstance(uuid, str):
        raise InvalidRequestError(f"{where}.uuid must be a string.", param=where)
    if not url:
        url = None
        if uuid is None:
            raise InvalidRequestError(f"{where} has neither an image URL nor a uuid.", param=where)
    return ImageRef(index=index, url=url, uuid=uuid, param=where)


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    """``stop``: a string or a list of strings (vLLM's request model), as a tuple."""
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise InvalidRequestError("'stop' must be a string or a list of strings.", param="stop")
    return tuple(stop)


def _opt_bool(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidRequestError(f"'{name}' must be a boolean.", param=name)
    return value


def _opt_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(f"'{name}' must be an integer.", param=name)
    return value
