"""Run by vLLM's own interpreter (the vLLM venv), never imported by mmgate: reads JSON lines, each a
list of content parts, and answers for each part how vLLM 0.32's chat parser reads it — with
vLLM's own ``_parse_chat_message_content_mm_part`` — as ``{"type", "content", "uuid"}`` or
``{"error"}``. ``tests/support/vllm_parser.py`` drives it."""

from __future__ import annotations

import json
import sys
from typing import Any

try:
    from vllm.renderers.chat_utils import _parse_chat_message_content_mm_part as read_part
except ImportError:  # vLLM before the renderers package
    from vllm.entrypoints.chat_utils import _parse_chat_message_content_mm_part as read_part


def plain(value: Any) -> Any:
    return value if isinstance(value, str | int | float | bool | type(None) | dict | list) else repr(value)


def answer(part: Any) -> dict[str, Any]:
    if isinstance(part, str):
        return {"type": "text", "content": part, "uuid": None}
    if not isinstance(part, dict):
        return {"error": "not an object"}
    try:
        kind, content = read_part(part)  # type: ignore[arg-type]
    except Exception as exc:  # vLLM's own validation errors: what a client would get as a 400
        return {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    uuid = part.get("uuid")
    return {"type": kind, "content": plain(content), "uuid": None if uuid is None else str(uuid)}


def main() -> None:
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        parts = json.loads(line)
        print(json.dumps([answer(p) for p in parts]), flush=True)


if __name__ == "__main__":
    main()
