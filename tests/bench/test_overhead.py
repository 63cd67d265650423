"""The client measuring itself: loop lag seen when the loop is really blocked, samples bounded,
CPU share; and stopping the monitor (or the progress bar) never swallows a cancellation of the
caller (``suppress(CancelledError)`` around ``await task`` did)."""

from __future__ import annotations

import asyncio
import io
import time

from rich.console import Console

from mmgate.bench.overhead import LoopLagMonitor
from mmgate.bench.progress import LiveProgress


async def test_loop_lag_sees_a_blocked_loop_and_cpu_is_measured() -> None:
    monitor = LoopLagMonitor(interval_s=0.005)
    monitor.start()
    await asyncio.sleep(0.05)
    time.sleep(0.1)  # noqa: ASYNC251 -- blocking the loop on purpose: the next wake-up is ~100 ms late
    deadline = time.perf_counter() + 0.05
    while time.perf_counter() < deadline:  # burn CPU on the loop
        pass
    await asyncio.sleep(0.05)
    await monitor.stop()
    lag = monitor.lag_ms()
    assert lag is not None and lag.max >= 80.0
    assert lag.p50 < 50.0  # the other wake-ups were about on time
    assert 0.2 < monitor.wall_s < 5.0
    assert 0.0 < monitor.cpu_percent <= 100.0 * (monitor.cpu_s / monitor.wall_s) + 1e-9


async def test_samples_are_bounded() -> None:
    monitor = LoopLagMonitor(interval_s=0.001, max_samples=5)
    monitor.start()
    await asyncio.sleep(0.1)
    await monitor.stop()
    lag = monitor.lag_ms()
    assert lag is not None and lag.count == 5


async def _cancelled_while_stopping(stop: asyncio.Task[None]) -> bool:
    await asyncio.sleep(0)  # stop() has cancelled its task and is awaiting it
    stop.cancel()
    await asyncio.wait([stop], timeout=5)
    return stop.cancelled()


async def test_stopping_the_monitor_keeps_a_cancellation_of_the_caller() -> None:
    monitor = LoopLagMonitor(interval_s=0.01)
    monitor.start()
    await asyncio.sleep(0.02)
    assert await _cancelled_while_stopping(asyncio.create_task(monitor.stop()))


async def test_progress_refreshes_from_counters_and_stop_keeps_a_cancellation() -> None:
    reads: list[int] = []

    def read() -> tuple[int, int, int]:
        reads.append(1)
        return len(reads), 0, 1

    out = io.StringIO()
    progress = LiveProgress(enabled=True, console=Console(file=out, width=100, force_terminal=True))
    progress.enabled = True  # stderr is no terminal under pytest; the console above is
    await progress.run(read, total=10, duration_s=None)
    await asyncio.sleep(0.6)  # refreshed every 0.25 s, never per request
    assert 2 <= len(reads) <= 4
    assert await _cancelled_while_stopping(asyncio.create_task(progress.stop()))
    disabled = LiveProgress(enabled=False)
    await disabled.run(read, total=None, duration_s=1.0)
    await disabled.stop()
