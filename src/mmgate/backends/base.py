"""The backend seam: one method, ``chat``, like httpx's transport.

A backend takes the rewritten request body (already in the form its kind understands) and returns a
``BackendReply``: its status and headers, and either the whole body or a stream of raw SSE bytes.
Error statuses always come back with the whole body read (``stream`` None), so callers can
inspect them (cache-miss healing) before anything reached the client.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

BackendKind = Literal["vllm", "openai"]

# vLLM's message when a cache-only image reference is not in its processor cache.
CACHE_MISS_MARKER = "but data is not provided"


@dataclass(slots=True)
class BackendReply:
    """What a backend answered. Exactly one of ``body``/``stream`` is set."""

    status: int
    content_type: str
    body: bytes | None = None
    stream: AsyncIterator[bytes] | None = None
    _release: Any = field(default=None, repr=False)

    def release(self) -> None:
        """Return the connection to the pool (idempotent)."""
        if self._release is not None:
            release, self._release = self._release, None
            release()


class Backend(Protocol):
    """One OpenAI-compatible server behind the gateway."""

    name: str
    kind: BackendKind
    url: str

    async def chat(self, body: bytes, *, stream: bool) -> BackendReply:
        """POST /v1/chat/completions with an already serialised body."""

    async def models(self) -> list[str]:
        """The model ids the backend serves (GET /v1/models)."""

    async def healthy(self) -> bool:
        """One health probe: True when the server answers its health endpoint."""

    async def close(self) -> None: ...


def is_cache_miss(status: int, body: Any) -> bool:
    """True for vLLM's cache-miss answer, in both its current and its older error-body shape."""
    if status != 400 or not isinstance(body, dict):
        return False
    err = body.get("error")
    message = err.get("message") if isinstance(err, dict) else body.get("message")
    return isinstance(message, str) and CACHE_MISS_MARKER in message and "Cache miss" in message


def error_message(body: Any, fallback: str) -> str:
    """The message of an OpenAI-style (or older vLLM-style) error body."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if isinstance(body.get("message"), str):
            return str(body["message"])
        if isinstance(body.get("detail"), str):
            return str(body["detail"])
    return fallback
