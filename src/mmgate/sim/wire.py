"""OpenAI wire format as vLLM writes it: completions, stream chunks, errors (pure logic)."""

from __future__ import annotations

from typing import Any

import orjson

from mmgate.sim.errors import SimError

SSE_DONE = b"data: [DONE]\n\n"


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """vLLM's error body: ``{"error": {"message", "type", "param", "code"}}``, code = status."""
    if status == 404:
        err_type = "NotFoundError"
    elif 400 <= status < 500:
        err_type = "BadRequestError"
    else:
        err_type = "InternalServerError"
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


def error_from_exception(exc: SimError) -> tuple[int, dict[str, Any]]:
    """Status and vLLM-style body for one of mmgate's errors."""
    return exc.status, error_body(exc.status, exc.message, exc.param)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def completion(
    *, request_id: str, created: int, model: str, choices: list[tuple[str, str, str | None]],
    prompt_tokens: int, completion_tokens: int,
) -> dict[str, Any]:
    """A non-streaming ``chat.completion`` object; ``choices``: (content, finish_reason, stop_reason) each."""
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": index,
                "message": {"role": "assistant", "content": content, "tool_calls": []},
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": stop_reason,
            }
            for index, (content, finish_reason, stop_reason) in enumerate(choices)
        ],
        "usage": usage(prompt_tokens, completion_tokens),
    }


class ChunkWriter:
    """Builds the SSE frames of one streamed completion, in vLLM's order.

    First a delta with the role (one per choice), then one delta per token and choice (each
    choice's last one carries its ``finish_reason``), then — with ``include_usage`` — a chunk with empty ``choices`` and the
    usage, then ``[DONE]``. With ``continuous_usage_stats`` every chunk also carries the usage so far.
    """

    def __init__(self, *, request_id: str, created: int, model: str, prompt_tokens: int,
                 include_usage: bool, continuous_usage_stats: bool) -> None:
        self._head = {"id": request_id, "object": "chat.completion.chunk", "created": created,
                      "model": model}
        self._prompt_tokens = prompt_tokens
        self._include_usage = include_usage
        self._continuous = include_usage and continuous_usage_stats

    def _frame(self, choices: list[dict[str, Any]], completion_tokens: int,
               final_usage: bool = False) -> bytes:
        chunk: dict[str, Any] = {**self._head, "choices": choices}
        if final_usage or self._continuous:
            chunk["usage"] = usage(self._prompt_tokens, completion_tokens)
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    def role(self, index: int = 0) -> bytes:
        choice = {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                  "finish_reason": None}
        return self._frame([choice], 0)

    def token(self, text: str, completion_tokens: int, finish_reason: str | None = None, index: int = 0,
              stop_reason: str | None = None) -> bytes:
        choice: dict[str, Any] = {"index": index, "delta": {"content": text}, "logprobs": None,
                                  "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["stop_reason"] = stop_reason
        return self._frame([choice], completion_tokens)

    def final_usage(self, completion_tokens: int) -> bytes | None:
        if not self._include_usage:
            return None
        return self._frame([], completion_tokens, final_usage=True)
