"""Find every image of an OpenAI Responses request, so it runs through the gateway's media pipeline.

vLLM 0.32 serves ``/v1/responses`` by turning ``input`` items into chat messages and handing them
to its chat parser (``vllm/entrypoints/openai/responses/utils.py``, ``construct_input_messages``):
a message item's ``input_image`` parts, and the ``input_image`` parts of a ``function_call_output``
whose ``output`` is a list, reach that parser as they are — and it reads their ``uuid``. So the
gateway keeps the request as it is and only rewrites those parts (``image_url`` the checked data
URL, ``uuid`` the content uuid, or ``image_url: null`` + uuid for a repeat): the engine's own
endpoint answers, with reuse.

Refused here, with a 400 naming the field (vLLM cannot serve them either, and the gateway never
forwards a URL or an id it has not checked):

* ``file_id`` on an image, ``input_file`` parts: vLLM 0.32 has no Files API to resolve them;
* ``computer_call_output`` items: vLLM 0.32 answers "Unsupported input item type";
* any other media part in a message or tool output (chat's ``image_url``, ``video_url``,
  ``input_audio``, embeddings, …, or a media key on a text part): vLLM's chat parser would read
  it unpoliced, and the Responses API's image part is ``input_image``;
* a message item without a ``role``: the gateway could not tell which parts vLLM renders;
* an item whose ``type`` is not a string.

An item of any other type that carries a ``role`` is policed as a message: vLLM validates it
loosely (its input is a union of TypedDicts, extra keys kept) and renders any item with a ``role``
as a chat message, ``content`` and all.

An ``mcp`` tool's ``server_url`` is returned in ``tool_urls`` for the URL policy (a string, else a
400 naming it): vLLM 0.32 connects only to its own ``--tool-server`` by ``server_label``, but a
backend that honours the URL would connect wherever a client points it.

Pure logic: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mmgate.api.chat_request import ChatRequest, check_depth
from mmgate.api.content_parts import MEDIA_KEYS, ImageSpec, parse_part
from mmgate.errors import InvalidRequestError
from mmgate.reuse import ImageSlot

# Item types whose ``output`` vLLM renders as a tool message (a list output keeps its parts).
_TOOL_OUTPUT_TYPES = frozenset({"function_call_output", "custom_tool_call_output"})


@dataclass(slots=True)
class ResponsesRequest:
    """A Responses request with its image slots; ``chat`` is what the gateway pipeline runs."""

    chat: ChatRequest
    previous_response_id: str | None
    tool_urls: list[tuple[int, str]]  # (index in ``tools``, the mcp tool's server_url) to police


def parse_responses_body(
    body: Any, *, max_images: int, max_uuid_length: int, max_depth: int, default_model: str | None = None
) -> ResponsesRequest:
    """Validate what the gateway relies on and collect the image slots (see the module docstring).

    ``default_model``: the fleet's one model, used when the request names none (as vLLM does).
    """
    if not isinstance(body, dict):
        raise InvalidRequestError("request body must be a JSON object")
    check_depth(body, max_depth)
    model = body.get("model")
    if model is None and default_model is not None:
        model = body["model"] = default_model
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("'model' is required and must be a non-empty string", param="model")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InvalidRequestError("'stream' must be a boolean", param="stream")
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        raise InvalidRequestError("'previous_response_id' must be a non-empty string", param="previous_response_id")
    items = body.get("input")
    slots: list[ImageSlot] = []
    if isinstance(items, list):
        for i, item in enumerate(items):
            _item_images(item, f"input[{i}]", slots, max_images=max_images, max_uuid_length=max_uuid_length)
    elif not isinstance(items, str):
        raise InvalidRequestError("'input' must be a string or an array of items", param="input")
    chat = ChatRequest(body=body, model=model, stream=stream, slots=slots)
    return ResponsesRequest(chat=chat, previous_response_id=previous, tool_urls=_mcp_urls(body.get("tools")))


def _mcp_urls(tools: Any) -> list[tuple[int, str]]:
    """The ``server_url`` of every ``mcp`` tool (a URL a backend may connect to), 400 when not a string."""
    urls: list[tuple[int, str]] = []
    if not isinstance(tools, list):
        return urls
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "mcp" or tool.get("server_url") is None:
            continue
        url = tool["server_url"]
        if not isinstance(url, str) or not url:
            raise InvalidRequestError("an mcp tool's 'server_url' must be a URL string", param=f"tools[{i}].server_url")
        urls.append((i, url))
    return urls


def _item_images(item: Any, where: str, slots: list[ImageSlot], *, max_images: int, max_uuid_length: int) -> None:
    if not isinstance(item, dict):
        raise InvalidRequestError("each input item must be an object", param=where)
    kind = item.get("type")
    if kind == "computer_call_output":
        raise InvalidRequestError(
            "'computer_call_output' items are not supported: vLLM has no computer-use tool; return the "
            "screenshot as a function_call_output (an input_image in its output list) or a user message",
            param=f"{where}.type",
        )
    if kind is not None and not isinstance(kind, str):
        raise InvalidRequestError("an input item's 'type' must be a string", param=f"{where}.type")
    if kind in _TOOL_OUTPUT_TYPES:
        parts, at = item.get("output"), f"{where}.output"
    elif kind in (None, "message") or "role" in item:
        # vLLM hands any item with a ``role`` to its chat parser as a message, whatever its type
        # says (an ``item_reference`` with a role and content): its parts are policed as one.
        if "role" not in item:
            raise InvalidRequestError("a message item needs a 'role' (user, assistant, system or developer)",
                                      param=f"{where}.role")
        parts, at = item.get("content"), f"{where}.content"
    else:
        return
    if not isinstance(parts, list):
        return
    for j, part in enumerate(parts):
        if not isinstance(part, dict):
            continue
        param = f"{at}[{j}]"
        ptype = part.get("type")
        if ptype == "input_file":
            raise InvalidRequestError(
                "'input_file' parts are not supported: vLLM has no Files API; send text or images",
                param=param,
            )
        if ptype != "input_image":
            if (isinstance(ptype, str) and ptype in MEDIA_KEYS) or not MEDIA_KEYS.isdisjoint(part):
                raise InvalidRequestError(
                    "only 'input_image' parts carry media in the Responses API through mmgate: send "
                    "{'type': 'input_image', 'image_url': '<http(s) or data: URL>'}", param=param)
            continue
        if part.get("file_id") is not None:
            raise InvalidRequestError(
                "'file_id' image inputs are not supported: vLLM has no Files API to resolve them; "
                "send image_url (an http(s) or data: URL)", param=f"{param}.file_id",
            )
        value = part.get("image_url")
        if value is not None and not isinstance(value, str) and not (isinstance(value, dict) and not value.get("url")):
            raise InvalidRequestError("an input_image's 'image_url' must be a URL string", param=f"{param}.image_url")
        try:
            # vLLM fills in a message item's missing ``detail``; a tool output's parts reach its chat
            # parser as they are, which refuses an input_image without one.
            spec = parse_part(part, max_uuid_length=max_uuid_length, require_detail=kind in _TOOL_OUTPUT_TYPES)
        except InvalidRequestError as exc:
            exc.param = param
            raise
        assert isinstance(spec, ImageSpec)
        # Rewritten in place for the backend: ``render`` fills image_url and uuid.
        part.pop("uuid", None)
        slots.append(ImageSlot(index=len(slots), param=param, part=part, url=spec.url, uuid=spec.uuid))
        if len(slots) > max_images:
            raise InvalidRequestError(f"too many images: at most {max_images} per request", param=param)
