"""The load generator: sessions in order, concurrency or request rate, count or duration.

A *worker* takes the next session and plays its turns one after another — a session's turns never
overlap. Before each turn it honours the dataset's pacing (``timestamp``: milliseconds after the
phase started; ``delay``: milliseconds after the previous turn finished), then, in request-rate
mode, waits for its slot of the arrival schedule (Poisson or constant). ``--concurrency N`` runs N
workers (N sessions in flight, at most one request each); rate mode alone runs up to
``max_active_sessions`` workers. With a request count or a duration the dataset is replayed (the
session ids of later passes get a ``#pass`` suffix); otherwise it is played once.

Each request's *intended* time (when pacing and schedule allowed it to leave) is kept with its
actual send time: the difference is the client's send lag.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mmgate.bench.client import ChatClient, ResponseResult
from mmgate.bench.dataset import Session, Turn
from mmgate.bench.images import ImageResolver
from mmgate.bench.payload import BodyOptions, Exchange, build_request
from mmgate.bench.planner import StripPlanner
from mmgate.bench.records import RequestRecord
from mmgate.bench.settings import Arrival, BenchSettings


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
    """Arrival schedule of ``rate`` requests/s. ``wait()`` returns the slot it waited for.

    Slots never lie in the past: when no session was ready at its slot, the schedule restarts
    from now instead of bursting to catch up.
    """

    def __init__(self, rate: float, arrival: Arrival, seed: int = 0) -> None:
        self._mean_ns = 1e9 / rate
        self._poisson = arrival == "poisson"
        self._rng = random.Random(seed)
        self._next_ns = 0

    def _interval_ns(self) -> float:
        return self._rng.expovariate(1.0) * self._mean_ns if self._poisson else self._mean_ns

    async def wait(self) -> int:
        now = time.perf_counter_ns()
        slot = max(self._next_ns, now)
        self._next_ns = slot + int(self._interval_ns())
        if slot > now:
            await asyncio.sleep((slot - now) / 1e9)
        return slot


@dataclass(frozen=True, slots=True)
class PhaseResult:
    """What a phase did."""

    started: int
    start_ns: int
    end_ns: int
    timed_out: bool


class LoadEngine:
    """Plays sessions against one endpoint. One engine per phase (warm-up, measured)."""

    def __init__(
        self,
        settings: BenchSettings,
        sessions: Sequence[Session],
        client: ChatClient,
        resolver: ImageResolver,
        options: BodyOptions,
        on_record: Callable[[RequestRecord], None] | None = None,
    ) -> None:
        self._settings = settings
        self._sessions = sessions
        self._client = client
        self._resolver = resolver
        self._options = options
        self._on_record = on_record
        self._stopping = False
        self._gate: RateGate | None = None
        self._budget = RequestBudget(None)
        self._source = SessionSource(sessions, cycle=False)
        self._phase_start_ns = 0
        self.started = 0
        self.in_flight = 0

    def stop(self) -> None:
        """Send no new request; requests in flight finish."""
        self._stopping = True

    async def run(
        self, *, request_count: int | None, duration_s: float | None, cycle: bool, prefix: str = ""
    ) -> PhaseResult:
        s = self._settings
        self._stopping = False
        self._budget = RequestBudget(request_count)
        self._source = SessionSource(self._sessions, cycle=cycle, prefix=prefix)
        self._gate = RateGate(s.request_rate, s.arrival, s.seed) if s.request_rate else None
        workers = s.concurrency if s.concurrency is not None else s.max_active_sessions
        self._phase_start_ns = time.perf_counter_ns()
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(self._worker()) for _ in range(workers)]
        timer = loop.call_later(duration_s, self.stop) if duration_s is not None else None
        timeout = duration_s + s.grace_period_s if duration_s is not None else None
        timed_out = False
        try:
            _, pending = await asyncio.wait(tasks, timeout=timeout)
            if pending:
                timed_out = True
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
        finally:
            if timer is not None:
                timer.cancel()
            for task in tasks:
                task.cancel()
        for task in tasks:
            error = None if task.cancelled() else task.exception()
            if error is not None:
                raise error  # a bug in the engine or the dataset's files, not a failed request
        return PhaseResult(self.started, self._phase_start_ns, time.perf_counter_ns(), timed_out)

    async def _worker(self) -> None:
        while not self._stopping:
            item = self._source.next()
            if item is None:
                return
            await self._play(*item)

    async def _pace(self, turn: Turn, previous_end_ns: int) -> int:
        """Sleep until the turn may leave; return its intended send time."""
        if turn.timestamp_ms is not None:
            due = self._phase_start_ns + int(turn.timestamp_ms * 1e6)
        elif turn.delay_ms is not None:
            due = previous_end_ns + int(turn.delay_ms * 1e6)
        else:
            due = previous_end_ns
        now = time.perf_counter_ns()
        if due > now:
            await asyncio.sleep((due - now) / 1e9)
        if self._gate is not None:
            due = max(due, await self._gate.wait())
        return due

    async def _play(self, wire_id: str, session: Session) -> None:
        planner = StripPlanner(self._settings.uuid_and_strip)
        history: list[Exchange] = []
        previous_end = time.perf_counter_ns()
        collect = session.accumulate_history
        for index, turn in enumerate(session.turns):
            intended = await self._pace(turn, previous_end)
            if self._stopping or not self._budget.take():
                self._stopping = True
                return
            self.started += 1
            self.in_flight += 1
            built = None
            try:
                built = await build_request(
                    self._options, self._resolver, planner, session.system_prompt, history, turn
                )
                result = await self._client.chat(
                    built.body, session_id=wire_id, stream=self._options.stream, collect_text=collect
                )
            except asyncio.CancelledError:
                if built is not None and self._on_record is not None:
                    now = time.perf_counter_ns()
                    lost = ResponseResult(0, "cancelled: still running at the end of --grace-period",
                                          intended, -1, now, 0, 0)
                    self._on_record(RequestRecord(wire_id, index, intended, lost, built.counts,
                                                  len(built.body)))
                raise
            finally:
                self.in_flight -= 1
            previous_end = time.perf_counter_ns()
            if result.ok:
                planner.commit(built.plan)
            elif result.cache_miss:
                planner.forget()
            if collect:
                history.append((turn, result.text if result.ok else None))
            if self._on_record is not None:
                self._on_record(
                    RequestRecord(wire_id, index, intended, result, built.counts, len(built.body))
                )

