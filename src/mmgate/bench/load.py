"""The load generator: sessions in order, concurrency or request rate, count or duration.

A *worker* takes the next session and plays its turns one after another — a session's turns never
overlap. Before each turn it honours the dataset's pacing (``delay``: milliseconds after the
previous turn finished; ``timestamp``: milliseconds after the phase started). ``--concurrency N``
runs N workers: N sessions in flight, at most one request each. With ``--request-rate`` the
schedule's slots (:class:`mmgate.bench.schedule.RateGate`) go first to sessions under way whose next
turn is due, then to workers starting a new session (up to ``--concurrency`` or
``max_active_sessions`` of them); ``timestamp`` does not apply in rate mode. With a request count or
a duration the dataset is replayed (later passes get a ``#pass`` suffix on their session ids);
otherwise it is played once. Stopping (count reached, duration over) interrupts every wait at once.

Each request's *intended* time (when pacing and schedule allowed it to leave) is kept with its
actual send time: the difference is the client's send lag.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mmgate.bench.client import ChatClient, ResponseResult
from mmgate.bench.dataset import Session, Turn
from mmgate.bench.engine_metrics import EngineCounters, EngineMetrics
from mmgate.bench.images import DatasetImages
from mmgate.bench.payload import BodyOptions, Exchange, build_request
from mmgate.bench.planner import StripPlanner
from mmgate.bench.records import RequestRecord
from mmgate.bench.schedule import RateGate, RequestBudget, SessionSource
from mmgate.bench.settings import BenchSettings


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
        resolver: DatasetImages,
        options: BodyOptions,
        on_record: Callable[[RequestRecord], None] | None = None,
        engine_probe: EngineMetrics | None = None,
    ) -> None:
        """``engine_probe``: read the engines' counters after each request (one request at a time only:
        with more, a request's share cannot be told apart)."""
        self._settings = settings
        self._sessions = sessions
        self._client = client
        self._resolver = resolver
        self._options = options
        self._on_record = on_record
        self._probe = engine_probe
        self._engine_last = EngineCounters()
        self._stopping = False
        self._stop_event = asyncio.Event()
        self._gate: RateGate | None = None
        self._budget = RequestBudget(None)
        self._source = SessionSource(sessions, cycle=False)
        self._phase_start_ns = 0
        self.started = 0
        self.in_flight = 0

    def stop(self) -> None:
        """Send no new request; requests in flight finish."""
        self._stopping = True
        self._stop_event.set()
        if self._gate is not None:
            self._gate.close()

    async def run(
        self, *, request_count: int | None, duration_s: float | None, cycle: bool, prefix: str = ""
    ) -> PhaseResult:
        s = self._settings
        self._stopping = False
        self._stop_event = asyncio.Event()
        self._budget = RequestBudget(request_count)
        self._source = SessionSource(self._sessions, cycle=cycle, prefix=prefix)
        self._gate = RateGate(s.request_rate, s.arrival, s.seed) if s.request_rate else None
        workers = s.concurrency if s.concurrency is not None else s.max_active_sessions
        if self._probe is not None:
            self._engine_last = await self._probe.read()
        self._phase_start_ns = time.perf_counter_ns()
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(self._worker()) for _ in range(workers)]
        dispatcher = loop.create_task(self._gate.run()) if self._gate is not None else None
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
            if dispatcher is not None:
                dispatcher.cancel()
                # wait() neither raises the task's CancelledError nor swallows a cancellation of ours.
                await asyncio.wait([dispatcher])
        for task in tasks:
            error = None if task.cancelled() else task.exception()
            if error is not None:
                raise error  # a bug in the engine or the dataset's files, not a failed request
        return PhaseResult(self.started, self._phase_start_ns, time.perf_counter_ns(), timed_out)

    async def _worker(self) -> None:
        while not self._stopping:
            slot = None
            if self._gate is not None:
                slot = await self._gate.wait(fresh=True)  # start a session only when a slot is free
                if slot is None:
                    return
            item = self._source.next()
            if item is None:
                if self._gate is not None:
                    self._gate.close_fresh()
                return
            await self._play(*item, first_slot=slot)

    async def _sleep_until(self, due_ns: int) -> None:
        delay = due_ns - time.perf_counter_ns()
        if delay > 0 and not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop_event.wait(), delay / 1e9)

    async def _pace(self, turn: Turn, previous_end_ns: int, first_slot: int | None) -> int | None:
        """Wait until the turn may leave; its intended send time, or None when stopping.

        In rate mode a session's first turn leaves at the slot that started it; later turns wait
        for their ``delay`` and then for a slot. ``timestamp`` applies without a rate only.
        """
        if first_slot is not None:
            return first_slot
        if turn.timestamp_ms is not None and self._gate is None:
            due = self._phase_start_ns + int(turn.timestamp_ms * 1e6)
        elif turn.delay_ms is not None:
            due = previous_end_ns + int(turn.delay_ms * 1e6)
        else:
            due = previous_end_ns
        await self._sleep_until(due)
        if self._gate is not None:
            slot = await self._gate.wait(fresh=False)
            if slot is None:
                return None
            due = max(due, slot)
        return due

    async def _play(self, wire_id: str, session: Session, first_slot: int | None = None) -> None:
        planner = StripPlanner(self._settings.uuid_and_strip)
        history: list[Exchange] = []
        previous_end = time.perf_counter_ns()
        collect = session.accumulate_history
        for index, turn in enumerate(session.turns):
            intended = await self._pace(turn, previous_end, first_slot if index == 0 else None)
            if intended is None:
                return
            if self._stopping:
                return
            if not self._budget.take():
                self.stop()
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
            engine_cache = await self._engine_delta()
            previous_end = time.perf_counter_ns()
            if result.ok:
                planner.commit(built.plan)
            elif result.cache_miss:
                planner.forget()
            if collect:
                history.append((turn, result.text if result.ok else None))
            if self._on_record is not None:
                self._on_record(
                    RequestRecord(wire_id, index, intended, result, built.counts, len(built.body), engine_cache)
                )

    async def _engine_delta(self) -> tuple[int, int] | None:
        """The engines' processor-cache (queries, hits) since the last read; None without a probe."""
        if self._probe is None:
            return None
        now = await self._probe.read()
        delta, self._engine_last = now - self._engine_last, now
        return delta.cache_queries, delta.cache_hits

