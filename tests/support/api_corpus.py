"""The bad-input corpus beyond chat's content parts: the same media faults in every other API vLLM
serves with media (Responses message items and tool outputs, Anthropic Messages image sources,
``/tokenize`` messages, completions), sent through the gateway and to vLLM directly by
``tests.support.part_corpus.corpus_run``. Placeholders as there, plus ``{missing}`` (an allowed
origin's URL answering 404) and ``{undecodable}`` (a ``data:`` URL that is no image).

``POLICY_REFUSALS`` (here and in ``part_corpus``) names every case the gateway refuses on purpose
where vLLM would act (docs/SECURITY.md lists each reason); every other case must get vLLM's
status class through the gateway.
"""

from __future__ import annotations

from typing import Any

MODEL_PLACEHOLDER = "{model}"
UNDECODABLE = "data:image/png;base64,AAAA"


def _responses(*items: dict[str, Any]) -> dict[str, Any]:
    return {"model": MODEL_PLACEHOLDER, "max_output_tokens": 1, "input": list(items)}


def _in_message(part: dict[str, Any]) -> dict[str, Any]:
    return _responses({"role": "user", "content": [{"type": "input_text", "text": "what is it?"}, part]})


def _in_tool_output(part: dict[str, Any]) -> dict[str, Any]:
    return _responses({"type": "function_call", "call_id": "c1", "name": "look", "arguments": "{}"},
                      {"type": "function_call_output", "call_id": "c1", "output": [part]})


def _messages(*blocks: dict[str, Any], history: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"model": MODEL_PLACEHOLDER, "max_tokens": 1,
            "messages": [*(history or []), {"role": "user", "content": [*blocks, {"type": "text", "text": "what?"}]}]}


def _image_block(source: dict[str, Any]) -> dict[str, Any]:
    return {"type": "image", "source": source}


def _tokenize(part: dict[str, Any]) -> dict[str, Any]:
    return {"model": MODEL_PLACEHOLDER,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "what is it?"}, part]}]}


def _image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def _input_image(url: str, **extra: Any) -> dict[str, Any]:
    return {"type": "input_image", "image_url": url, **extra}


RESPONSES, MESSAGES, TOKENIZE, COMPLETIONS = "/v1/responses", "/v1/messages", "/tokenize", "/v1/completions"

# (name, path, body): every body is sent as it is, with the placeholders filled in.
API_CASES: list[tuple[str, str, Any]] = [
    ("responses: input_image, no detail", RESPONSES, _in_message(_input_image("{png}"))),
    ("responses: input_image undecodable", RESPONSES, _in_message(_input_image("{undecodable}", detail="auto"))),
    ("responses: input_image answering 404", RESPONSES, _in_message(_input_image("{missing}", detail="auto"))),
    ("responses: input_image secret URL", RESPONSES, _in_message(_input_image("{secret}", detail="auto"))),
    ("responses: input_image object image_url", RESPONSES,
     _in_message({"type": "input_image", "image_url": {"url": "{png}"}, "detail": "auto"})),
    ("responses: input_image bad detail", RESPONSES, _in_message(_input_image("{png}", detail="huge"))),
    ("responses: input_image file_id", RESPONSES,
     _in_message({"type": "input_image", "file_id": "file-1", "detail": "auto"})),
    ("responses: input_image unknown uuid", RESPONSES,
     _in_message({"type": "input_image", "image_url": None, "uuid": "never-sent", "detail": "auto"})),
    ("responses: input_file", RESPONSES, _in_message({"type": "input_file", "file_data": "AAAA", "filename": "a.pdf"})),
    ("responses: chat image_url part", RESPONSES, _in_message(_image("{png}"))),
    ("responses: tool output input_image, no detail", RESPONSES, _in_tool_output(_input_image("{png}"))),
    ("responses: tool output input_image undecodable", RESPONSES,
     _in_tool_output(_input_image("{undecodable}", detail="auto"))),
    ("responses: tool output input_image answering 404", RESPONSES,
     _in_tool_output(_input_image("{missing}", detail="auto"))),
    ("responses: tool output secret URL", RESPONSES, _in_tool_output(_input_image("{secret}", detail="auto"))),
    ("responses: computer_call_output", RESPONSES,
     _responses({"type": "computer_call_output", "call_id": "c1",
                 "output": {"type": "computer_screenshot", "image_url": "{png}"}})),
    ("messages: base64 undecodable", MESSAGES,
     _messages(_image_block({"type": "base64", "media_type": "image/png", "data": "AAAA"}))),
    ("messages: url answering 404", MESSAGES, _messages(_image_block({"type": "url", "url": "{missing}"}))),
    ("messages: url secret", MESSAGES, _messages(_image_block({"type": "url", "url": "{secret}"}))),
    ("messages: unknown source type", MESSAGES, _messages(_image_block({"type": "file", "file_id": "f1"}))),
    ("messages: source without data", MESSAGES, _messages(_image_block({"type": "base64", "media_type": "image/png"}))),
    ("messages: tool_use input not an object", MESSAGES, _messages(
        {"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
        history=[{"role": "user", "content": "go"},
                 {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": True}]}])),
    ("messages: tool_result with an undecodable image", MESSAGES, _messages(
        {"type": "tool_result", "tool_use_id": "t1", "content": [_image_block(
            {"type": "base64", "media_type": "image/png", "data": "AAAA"})]},
        history=[{"role": "user", "content": "go"},
                 {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]}])),
    ("tokenize: undecodable", TOKENIZE, _tokenize(_image("{undecodable}"))),
    ("tokenize: answering 404", TOKENIZE, _tokenize(_image("{missing}"))),
    ("tokenize: secret URL", TOKENIZE, _tokenize(_image("{secret}"))),
    ("tokenize: image_url string by type", TOKENIZE, _tokenize({"type": "image_url", "image_url": "{png}"})),
    ("tokenize: input_image, no detail", TOKENIZE, _tokenize(_input_image("{png}"))),
    ("tokenize: video_url string by type", TOKENIZE, _tokenize({"type": "video_url", "video_url": "{origin}"})),
    ("tokenize: image_embeds", TOKENIZE, _tokenize({"type": "image_embeds", "image_embeds": "AAAA"})),
    ("completions: prompt_embeds", COMPLETIONS, {"model": MODEL_PLACEHOLDER, "prompt_embeds": "AAAA", "max_tokens": 1}),
]

# Cases the gateway refuses on purpose where vLLM acts, by docs/SECURITY.md's reason.
POLICY_REFUSALS: dict[str, str] = {
    "responses: input_image secret URL": "url-policy",
    "responses: tool output secret URL": "url-policy",
    "messages: url secret": "url-policy",
    "tokenize: secret URL": "url-policy",
}
