"""Token counts read from the ``usage`` object a backend returns: in a whole JSON answer, or in
the last event of a stream that carries one (``stream_options.include_usage``, or vLLM's
continuous usage stats). Pure byte scanning: the answer is never parsed whole again."""

from __future__ import annotations

import re

_USAGE = b'"usage"'
# OpenAI's names (chat, completions, embeddings) and the Responses/Messages names.
_PROMPT = re.compile(rb'"(?:prompt_tokens|input_tokens)"\s*:\s*(\d{1,12})')
_COMPLETION = re.compile(rb'"(?:completion_tokens|output_tokens)"\s*:\s*(\d{1,12})')
# The usage object is small; past this many bytes after its key the match is something else.
_USAGE_WINDOW = 1024


def token_usage(data: bytes | bytearray | memoryview | None) -> tuple[int, int] | None:
    """(prompt, completion) tokens of the last ``usage`` object in ``data``; None when it carries
    none (``"usage": null`` or no key). A missing completion count (embeddings) is 0."""
    if not data:
        return None
    raw = bytes(data) if isinstance(data, memoryview) else data
    at = raw.rfind(_USAGE)
    if at < 0:
        return None
    window = raw[at:at + _USAGE_WINDOW]
    prompt = _PROMPT.search(window)
    if prompt is None:
        return None
    completion = _COMPLETION.search(window)
    return int(prompt.group(1)), int(completion.group(1)) if completion is not None else 0


def has_usage(chunk: bytes | bytearray | memoryview) -> bool:
    """Whether a stream chunk may carry a usage object (cheap: one substring search)."""
    return _USAGE in chunk
