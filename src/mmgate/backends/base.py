"""The backend seam, like httpx's transport: ``chat`` carries every chat-style request (the body
the reuse pipeline rewrote, to ``/v1/chat/completions`` or another path that reads the same
messages), ``request`` any other request as it came (any method and path, a whole or streamed body);
``models``, ``healthy`` and ``close`` serve routing and shutdown.

A backend takes the rewritten request body (already in the form its kind understands) and returns a
``BackendReply``: its status and headers, and either the whole body or a stream of raw SSE bytes.
Error statuses always come back with the whole body read (``stream`` None), so callers can
inspect them (cache-miss healing) before anything reached the client.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from mmgate.errors import MmgateError
from mmgate.vllm_protocol import error_message

__all__ = ["CHAT_PATH", "Backend", "BackendKind", "BackendReply", "drain", "error_message"]

CHAT_PATH = "/v1/chat/completions"
# What is read of a reply's stream after its last event (vLLM sends nothing more), at most.
DRAIN_BYTES = 64 * 1024

BackendKind = Literal["vllm", "openai"]


@dataclass(slots=True)
class BackendReply:
    """What a backend answered. Exactly one of ``body``/``stream`` is set."""

    status: int
    content_type: str
    body: bytes | None = None
    stream: AsyncIterator[bytes] | None = None
    _release: Any = field(default=None, repr=False)
    # Of the stream: has its first chunk arrived; has it delivered all it had (see the methods).
    _arrived: Callable[[], bool] | None = field(default=None, repr=False)
    _ended: Callable[[], bool] | None = field(default=None, repr=False)

    def release(self) -> None:
        """Return the connection to the pool (idempotent)."""
        if self._release is not None:
            release, self._release = self._release, None
            release()

    def stream_arrived(self) -> bool:
        """Whether the stream's first chunk (or its end) is already here, so it can go out with
        the response's head in one write; False when unknown (the head goes out alone)."""
        return self._arrived is not None and self._arrived()

    def stream_ended(self) -> bool:
        """Whether the stream has nothing left beyond the chunks it has yielded, so the last
        one can go out with the response's end in one write; False when unknown."""
        return self._ended is not None and self._ended()


class Backend(Protocol):
    """One OpenAI-compatible server behind the gateway."""

    name: str
    kind: BackendKind
    url: str

    async def chat(self, body: bytes, *, stream: bool, path: str = CHAT_PATH) -> BackendReply:
        """POST ``path`` (chat completions unless told) with an already serialised JSON body."""

    async def request(
        self, method: str, path: str, *, body: bytes | AsyncIterable[bytes] | None = None,
        headers: Mapping[str, str] | None = None, stream: bool = False,
    ) -> BackendReply:
        """Any request: ``method`` ``path`` (with its query string), ``body`` whole or as chunks
        sent as they come (an upload), ``headers`` the caller passes on (``Content-Type``,
        ``Accept``; the backend's own ``Authorization`` replaces any given). The reply is whole
        unless ``stream`` and the backend answers 200 with an event stream; errors as for ``chat``."""

    async def models(self) -> list[str]:
        """The model ids the backend serves (GET /v1/models)."""

    async def healthy(self) -> bool:
        """One health probe: True when the server answers its health endpoint."""

    async def close(self) -> None: ...


async def drain(stream: AsyncIterator[bytes], received: int = 0) -> None:
    """Read what a backend's stream still sends after its last event (vLLM: nothing, then the
    reply's end), ``received`` bytes of it already, at most ``DRAIN_BYTES``: a reply read to its
    end leaves its connection open for the next request; one abandoned early is closed (a new
    connection a turn, for the gateway and vLLM). The client has its whole answer already: a
    failure here costs the connection, nothing more."""
    with contextlib.suppress(MmgateError):
        async for chunk in stream:
            received += len(chunk)
            if received > DRAIN_BYTES:
                return
