"""The sim's store of responses (``--responses-store-mb``): vLLM's with
``VLLM_ENABLE_RESPONSES_API_STORE=1``, bounded.

What it keeps of vLLM 0.32: a response is stored under its request's ``request_id`` (a second
request with the same id replaces it) with the chat messages its prompt was made of, so that a
``previous_response_id`` continues the conversation: its messages (system ones dropped: a
request's instructions do not carry over), then its answer as an assistant message, then the new
input. A background response is stored ``queued`` until its answer replaces it, and can be
cancelled until then; its events, when streamed, are kept for a reader that comes back
(``GET …?stream=true&starting_after=N``). vLLM never forgets a response; the sim forgets the least
recently used past its budget, counted as the request bodies the conversation was made of (what a
continuation holds: its history's messages), and keeps no conversation larger than the budget.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

# What an entry costs beyond its bodies (the dicts, the answer, the id): counted so that a budget
# also bounds the number of entries.
ENTRY_OVERHEAD_BYTES = 1024


@dataclass
class Stored:
    """One stored response: the response object (its ``status`` changes while it runs in the
    background), the chat messages of its prompt, and its counted size."""

    response: dict[str, Any]
    messages: list[dict[str, Any]]
    size: int
    task: asyncio.Task[None] | None = None
    events: list[bytes] | None = None  # a background stream's events, in order
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def add_event(self, event: bytes) -> None:
        assert self.events is not None
        self.events.append(event)
        self._arrived.set()

    async def replay(self, starting_after: int | None) -> AsyncIterator[bytes]:
        """A background stream's events after sequence number ``starting_after``, then each as it
        comes, until the run ends (done or cancelled)."""
        index = 0 if starting_after is None else max(0, starting_after + 1)
        events = self.events if self.events is not None else []
        while True:
            self._arrived.clear()
            while index < len(events):
                yield events[index]
                index += 1
            if self.task is None or self.task.done():
                return
            await self._arrived.wait()

    def history(self) -> list[dict[str, Any]]:
        """The messages a continuation of this response starts with (vLLM's
        ``construct_input_messages``): its prompt's without the system ones, then its answer."""
        messages = [m for m in self.messages if m.get("role") != "system"]
        for item in self.response.get("output") or []:
            if item.get("type") == "message":
                messages += [{"role": "assistant", "content": part.get("text")} for part in item.get("content") or []]
        return messages

    def ended(self) -> None:
        """The background run is over: wake the readers waiting for an event."""
        self._arrived.set()


class ResponseStore:
    """Responses by id, least recently used first out past ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, Stored] = OrderedDict()
        self._counted: dict[str, int] = {}  # each entry's size when stored (``Stored.size`` may grow)
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes_used(self) -> int:
        return self._bytes

    def get(self, response_id: str) -> Stored | None:
        found = self._entries.get(response_id)
        if found is not None:
            self._entries.move_to_end(response_id)
        return found

    def put(self, response_id: str, stored: Stored) -> bool:
        """Store (or replace) ``response_id``; the least recently used go while over budget (not a
        background one still running). An entry over the whole budget is not kept (False): a
        conversation that outgrew the store ends there, its next continuation not found."""
        self._drop(response_id)
        if stored.size > self.max_bytes:
            return False
        self._entries[response_id] = stored
        self._counted[response_id] = stored.size
        self._bytes += stored.size
        for key in list(self._entries):
            if self._bytes <= self.max_bytes or key == response_id:
                break
            task = self._entries[key].task
            if task is None or task.done():
                self._drop(key)
        return True

    def _drop(self, response_id: str) -> None:
        if self._entries.pop(response_id, None) is not None:
            self._bytes -= self._counted.pop(response_id)

    async def close(self) -> None:
        """Cancel every background run and wait for them (the engine is closing)."""
        running = [stored.task for stored in self._entries.values() if stored.task is not None]
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
