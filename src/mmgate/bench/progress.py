"""Live progress bar (rich), refreshed from counters a few times a second — never per request.

Off when stderr is not a terminal or with ``--quiet``.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class LiveProgress:
    """Shows requests done (of the count, or of the duration in seconds) and errors."""

    def __init__(self, enabled: bool, console: Console | None = None) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self._console = console or Console(stderr=True)
        self._progress: Progress | None = None
        self._task: asyncio.Task[None] | None = None

    async def run(
        self,
        read: Callable[[], tuple[int, int, int]],
        total: int | None,
        duration_s: float | None,
        label: str = "bench",
    ) -> None:
        """Start refreshing; ``read`` returns (done, errors, in flight)."""
        if not self.enabled:
            return
        progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"), TimeElapsedColumn(),
            console=self._console, transient=True, refresh_per_second=4,
        )
        self._progress = progress
        progress.start()
        loop = asyncio.get_running_loop()
        start = loop.time()
        bar_total = float(total) if total is not None else (duration_s if duration_s is not None else None)
        task_id = progress.add_task(label, total=bar_total, detail="")

        async def refresh() -> None:
            while True:
                done, errors, in_flight = read()
                completed = float(done) if total is not None or duration_s is None else loop.time() - start
                progress.update(task_id, completed=completed,
                                detail=f"{done:,} done  {errors:,} errors  {in_flight} in flight")
                await asyncio.sleep(0.25)

        self._task = loop.create_task(refresh())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            # wait() neither raises the task's CancelledError nor swallows a cancellation of ours.
            await asyncio.wait([self._task])
            self._task = None
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
