"""What the load generator plays and when: session order, request budget, request-rate slots.

``RateGate`` hands out the slots of an arrival schedule (Poisson or constant, ``rate`` per second).
At each slot the turn of a session already under way goes first; only when none is waiting does a
worker start a new session with it — so a multi-turn session is not starved by a crowd of new
ones, and the number of sessions in flight grows only as far as the rate needs. When nobody at all
is waiting, the slot goes to the next arrival and the schedule restarts from then (no burst to
catch up).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import deque
from collections.abc import Sequence

from mmgate.bench.dataset import Session
from mmgate.bench.settings import Arrival


class SessionSource:
    """Hands out sessions in dataset order, replaying the dataset when ``cycle`` is set."""

    def __init__(self, sessions: Sequence[Session], cycle: bool, prefix: str = "") -> None:
        self._sessions = sessions
        self._cycle = cycle
        self._prefix = prefix
        self._index = 0
        self._pass = 0

    def next(self) -> tuple[str, Session] | None:
        if not self._sessions:
            return None
        if self._index >= len(self._sessions):
            if not self._cycle:
                return None
            self._index = 0
            self._pass += 1
        session = self._sessions[self._index]
        self._index += 1
        suffix = f"#{self._pass}" if self._pass else ""
        return f"{self._prefix}{session.session_id}{suffix}", session


class RequestBudget:
    """How many requests may still start; None: no limit."""

    def __init__(self, limit: int | None) -> None:
        self.remaining = limit

    def take(self) -> bool:
        if self.remaining is None:
            return True
        if self.remaining <= 0:
            return False
        self.remaining -= 1
        return True


class RateGate:
    """Slots of an arrival schedule, continuing sessions first. Run ``run()`` as a task."""

    def __init__(self, rate: float, arrival: Arrival, seed: int = 0) -> None:
        self._mean_ns = 1e9 / rate
        self._poisson = arrival == "poisson"
        self._rng = random.Random(seed)
        self._continuing: deque[asyncio.Future[int | None]] = deque()
        self._fresh: deque[asyncio.Future[int | None]] = deque()
        self._arrived = asyncio.Event()
        self._closed = False
        self._fresh_closed = False

    def _interval_ns(self) -> int:
        return int(self._rng.expovariate(1.0) * self._mean_ns if self._poisson else self._mean_ns)

    async def wait(self, fresh: bool) -> int | None:
        """The slot (``perf_counter_ns``) this request may leave at; None once the gate closed.

        ``fresh``: a worker wanting to start a new session (served after continuing sessions).
        """
        if self._closed or (fresh and self._fresh_closed):
            return None
        future: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        (self._fresh if fresh else self._continuing).append(future)
        self._arrived.set()
        return await future

    def close_fresh(self) -> None:
        """No session is left to start: workers waiting to start one get None."""
        self._fresh_closed = True
        _resolve_all(self._fresh)

    def close(self) -> None:
        """Stop: everyone waiting gets None."""
        self._closed = True
        _resolve_all(self._continuing)
        _resolve_all(self._fresh)

    def _next_waiter(self) -> asyncio.Future[int | None] | None:
        for queue in (self._continuing, self._fresh):
            while queue:
                future = queue.popleft()
                if not future.done():
                    return future
        return None

    async def run(self) -> None:
        """Release one waiter per slot until closed."""
        next_ns = time.perf_counter_ns()
        while not self._closed:
            delay = next_ns - time.perf_counter_ns()
            if delay > 0:
                await asyncio.sleep(delay / 1e9)
            slot = next_ns
            waiter = self._next_waiter()
            while waiter is None and not self._closed:
                self._arrived.clear()
                await self._arrived.wait()
                waiter = self._next_waiter()
                slot = max(slot, time.perf_counter_ns())
            if waiter is None:
                return
            waiter.set_result(slot)
            next_ns = slot + self._interval_ns()


def _resolve_all(queue: deque[asyncio.Future[int | None]]) -> None:
    while queue:
        future = queue.popleft()
        with contextlib.suppress(asyncio.InvalidStateError):
            future.set_result(None)
