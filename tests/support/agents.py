"""Clients for the Anthropic Messages and OpenAI Responses APIs in tests: bounded raw HTTP calls,
SSE events kept with their names, and the normalisation a direct-vs-gateway comparison needs
(generated ids and timestamps differ from call to call, nothing else may)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

TIMEOUT = aiohttp.ClientTimeout(total=90, sock_connect=10)
# Fields that differ between two calls by design: ids minted per response, times, stream sequence
# numbers (how many delta events a stream has varies, below), and prefix-cache hits, which depend on
# the replica's history and on the images' identifiers (the gateway's uuid or vLLM's own hash).
_VOLATILE = frozenset({"id", "created_at", "signature", "item_id", "completed_at", "sequence_number",
                       "cached_tokens", "cache_write_tokens"})
# How a streamed delta is merged with the next one of the same block: vLLM sends whatever tokens
# are ready when the client reads, so one text can come as one delta or as several.
_MERGEABLE = {"content_block_delta": ("delta", ("text", "partial_json", "thinking")),
              "response.output_text.delta": (None, ("delta",)),
              "response.function_call_arguments.delta": (None, ("delta",)),
              "response.reasoning_text.delta": (None, ("delta",))}


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
            return self.status, [(name, _blank(data)) for name, data in _merged(self.events)]
        return self.status, _blank(self.json)


def _merged(events: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Consecutive deltas of the same block as one event (see ``_MERGEABLE``)."""
    out: list[tuple[str, Any]] = []
    for name, data in events:
        rule = _MERGEABLE.get(name)
        if rule is not None and out and out[-1][0] == name and isinstance(data, dict):
            inner, fields = rule
            prev = out[-1][1]
            a, b = (prev[inner], data[inner]) if inner else (prev, data)
            same_block = all(prev.get(k) == data.get(k) for k in ("index", "output_index", "content_index"))
            if same_block and a.get("type") == b.get("type"):
                merged = {**a, **{f: a[f] + b[f] for f in fields if isinstance(a.get(f), str) and f in b}}
                out[-1] = (name, {**prev, inner: merged} if inner else merged)
                continue
        out.append((name, data))
    return out


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
