"""Clients for the Anthropic Messages and OpenAI Responses APIs in tests: bounded raw HTTP calls,
SSE events kept with their names, and the normalisation a direct-vs-gateway comparison needs
(generated ids and timestamps differ from call to call, nothing else may)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

TIMEOUT = aiohttp.ClientTimeout(total=90, sock_connect=10)
# Fields that differ between two calls by design: ids minted per response, and times.
_VOLATILE = frozenset({"id", "created_at", "signature", "item_id", "completed_at"})


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    json: Any = None
    events: list[tuple[str, Any]] = field(default_factory=list)
    raw: bytes = b""

    def reuse(self) -> dict[str, int]:
        """``x-mmgate-reuse`` as numbers: sent, stripped, referenced, healed."""
        text = self.headers.get("x-mmgate-reuse", "")
        return {k.strip(): int(v) for k, _, v in (p.partition("=") for p in text.split(";")) if k.strip()}

    def normalised(self) -> Any:
        """Status and body (or event names and payloads) with the volatile fields blanked."""
        if self.events:
            return self.status, [(name, _blank(data)) for name, data in self.events]
        return self.status, _blank(self.json)


def _blank(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: "*" if k in _VOLATILE and isinstance(v, str | int) else _blank(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_blank(v) for v in node]
    return node


async def call(
    url: str, path: str, payload: Any = None, *, method: str = "POST", headers: dict[str, str] | None = None,
    raw: bytes | None = None,
) -> Reply:
    """``method url+path`` with ``payload`` as JSON (or ``raw`` bytes); parses JSON or SSE events."""
    data = raw if raw is not None else (orjson.dumps(payload) if payload is not None else None)
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http, http.request(
        method, url + path, data=data, headers={"Content-Type": "application/json", **(headers or {})}
    ) as resp:
        body = await resp.read()
        reply = Reply(resp.status, {k.lower(): v for k, v in resp.headers.items()}, raw=body)
        if resp.content_type == "text/event-stream":
            for frame in body.decode().split("\n\n"):
                name, data_line = "message", None
                for line in frame.splitlines():
                    if line.startswith("event: "):
                        name = line[len("event: "):]
                    elif line.startswith("data: "):
                        data_line = line[len("data: "):]
                if data_line is not None:
                    reply.events.append((name, data_line if data_line == "[DONE]" else orjson.loads(data_line)))
        else:
            reply.json = orjson.loads(body) if body else None
        return reply


def is_anthropic_error(reply: Reply) -> bool:
    """``{"type": "error", "error": {"type": str, "message": str}}``."""
    body = reply.json
    return (isinstance(body, dict) and body.get("type") == "error" and isinstance(body.get("error"), dict)
            and isinstance(body["error"].get("type"), str) and isinstance(body["error"].get("message"), str))


def is_openai_error(reply: Reply) -> bool:
    """``{"error": {"message": str, "type": str, "param", "code"}}``."""
    body = reply.json
    return (isinstance(body, dict) and isinstance(body.get("error"), dict)
            and isinstance(body["error"].get("message"), str) and isinstance(body["error"].get("type"), str))
