"""Backend objects that left the fleet (``Router.set_backends``): each is closed once the requests
it had in flight have ended (streams included), after the drain timeout at most, so a client's
stream is never cut by a fleet change and no connection pool is left open."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from mmgate.backends import Backend

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Leaving:
    backend: Backend
    drained: asyncio.Event
    counts_for_name: bool


class Retirements:
    """Requests in flight per backend *object*, and the retired objects waiting to be closed.

    ``counts_for_name``: a retired object's requests still count in its name's load (it was
    replaced by another object of the same name, not removed)."""

    def __init__(self, drain_timeout_s: float) -> None:
        self.drain_timeout_s = drain_timeout_s
        self._in_flight: dict[int, int] = {}  # id(backend) -> requests in flight; only objects held here
        self._leaving: dict[int, _Leaving] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    def track(self, backend: Backend) -> None:
        self._in_flight.setdefault(id(backend), 0)

    def begin(self, backend: Backend) -> None:
        if id(backend) in self._in_flight:
            self._in_flight[id(backend)] += 1

    def end(self, backend: Backend) -> None:
        left = self._in_flight.get(id(backend))
        if left is None:
            return
        self._in_flight[id(backend)] = left = max(0, left - 1)
        leaving = self._leaving.get(id(backend))
        if leaving is not None and left == 0:
            leaving.drained.set()

    def load(self, name: str, current: Backend | None) -> int:
        """Requests in flight under ``name``: its ``current`` object's and those of the retiring
        objects that still count in it (the router's load; one count per request, kept here)."""
        own = self._in_flight.get(id(current), 0) if current is not None else 0
        if not self._leaving:
            return own
        return own + sum(self._in_flight.get(key, 0) for key, leaving in self._leaving.items()
                         if leaving.counts_for_name and leaving.backend.name == name)

    def name_left(self, name: str) -> None:
        """The name left the fleet: no retiring object's requests count in it any more."""
        for leaving in self._leaving.values():
            if leaving.backend.name == name:
                leaving.counts_for_name = False

    def retire(self, backend: Backend, *, counts_for_name: bool) -> None:
        """Close ``backend`` once its requests in flight have ended (a task on the running loop)."""
        drained = asyncio.Event()
        self._leaving[id(backend)] = _Leaving(backend, drained, counts_for_name)
        if not self._in_flight.get(id(backend)):
            drained.set()
        self.spawn(self._close_when_drained(backend, drained), f"mmgate-router-retire-{backend.name}")

    async def _close_when_drained(self, backend: Backend, drained: asyncio.Event) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.drain_timeout_s):
                await drained.wait()
        if self._in_flight.get(id(backend)):
            log.warning("retired backend %s closed with requests in flight after the drain timeout", backend.name)
        self._leaving.pop(id(backend), None)
        self._in_flight.pop(id(backend), None)
        await backend.close()

    def spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run ``work`` as a task that ``tasks`` holds until it ends; a failure is logged."""
        task = asyncio.get_running_loop().create_task(work, name=name)
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # Nothing awaits these tasks: say what failed (the probe loop's next round retries a refresh).
            log.error("%s failed", task.get_name(), exc_info=task.exception())

    def waiting(self) -> list[Backend]:
        """The retired objects not closed yet, handed over (forgotten here) for the caller to close."""
        backends = [leaving.backend for leaving in self._leaving.values()]
        self._leaving.clear()
        return backends
