"""The client measures itself: event-loop lag, CPU time, send lag — and says when it is the bottleneck.

* **Loop lag**: a task asks to wake every ``interval`` and records how late it woke. When the loop
  is busy (parsing, building bodies) every timestamp the tool takes is late by about that much.
* **Send lag**: per request, time from when it should have left (previous turn done + delay, or
  its rate slot) to when it was handed to aiohttp; recorded with each request.
* **CPU**: process CPU time over wall time. One Python event loop cannot use more than one core;
  near 100% the client, not the server, limits the run.

``client_warnings`` (pure) turns these into plain-language warnings.
"""

from __future__ import annotations

import asyncio
import os
import time
from array import array
from dataclasses import dataclass

import numpy as np

from mmgate.bench.stats import Distribution, distribution

CPU_BOUND_PERCENT = 85.0
LAG_WARN_MS = 5.0
MIN_WALL_S = 1.0  # CPU share of shorter runs is dominated by start-up work


class LoopLagMonitor:
    """Samples event-loop wake-up lateness while running (bounded: at most ``max_samples``)."""

    def __init__(self, interval_s: float = 0.01, max_samples: int = 1_000_000) -> None:
        self._interval_ns = int(interval_s * 1e9)
        self._max = max_samples
        self._samples: array[int] = array("q")
        self._task: asyncio.Task[None] | None = None
        self._cpu0 = 0.0
        self._wall0 = 0
        self.cpu_s = 0.0
        self.wall_s = 0.0

    def start(self) -> None:
        self._cpu0 = time.process_time()
        self._wall0 = time.perf_counter_ns()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        self.cpu_s = time.process_time() - self._cpu0
        self.wall_s = (time.perf_counter_ns() - self._wall0) / 1e9
        if self._task is not None:
            self._task.cancel()
            # wait() neither raises the task's CancelledError nor swallows a cancellation of ours
            # (suppress(CancelledError) around ``await task`` would swallow both).
            await asyncio.wait([self._task])
            self._task = None

    async def _run(self) -> None:
        interval_s = self._interval_ns / 1e9
        while True:
            t0 = time.perf_counter_ns()
            await asyncio.sleep(interval_s)
            if len(self._samples) < self._max:
                self._samples.append(max(0, time.perf_counter_ns() - t0 - self._interval_ns))

    def lag_ms(self) -> Distribution | None:
        if not self._samples:
            return None
        return distribution(np.frombuffer(self._samples, dtype=np.int64) / 1e6)

    @property
    def cpu_percent(self) -> float:
        """Process CPU (all threads) as a percentage of one core over the measured window."""
        return 100.0 * self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(frozen=True, slots=True)
class ClientOverhead:
    """The tool's own cost during the measured phase."""

    cpu_percent: float
    cpu_s: float
    wall_s: float
    loop_lag_ms: Distribution | None
    send_lag_ms: Distribution | None
    cpu_count: int = os.cpu_count() or 1


def client_warnings(
    overhead: ClientOverhead, target_rate: float | None = None, achieved_rate: float | None = None
) -> list[str]:
    """Warnings for a run whose numbers describe the client more than the server."""
    out: list[str] = []
    if overhead.cpu_percent >= CPU_BOUND_PERCENT and overhead.wall_s >= MIN_WALL_S:
        out.append(
            f"the benchmark process used {overhead.cpu_percent:.0f}% of a CPU core: the client is "
            "likely the bottleneck; lower --concurrency/--request-rate or run several bench processes"
        )
    lag = overhead.loop_lag_ms
    if lag is not None and lag.p99 >= LAG_WARN_MS:
        out.append(
            f"event-loop lag p99 {lag.p99:.1f} ms: timestamps taken by the client may be late by "
            "that much (TTFT and latency inflated)"
        )
    send = overhead.send_lag_ms
    if send is not None and send.p99 >= LAG_WARN_MS:
        out.append(
            f"requests left the client {send.p99:.1f} ms (p99) after they were due: the client "
            "could not keep the schedule"
        )
    if target_rate and achieved_rate is not None and achieved_rate < 0.9 * target_rate:
        out.append(
            f"achieved {achieved_rate:.1f} requests/s of the {target_rate:.1f} asked for "
            "(server saturated, too few sessions, or a client-bound run)"
        )
    return out
