"""In-flight dedup: concurrent loads of one key share one fetch.

The shared work runs in a task owned by the map, and every caller awaits it through
``asyncio.shield``: a caller that is cancelled (its client went away) stops waiting without
cancelling the work for the others; when the last caller waiting has gone, the work is cancelled
(a fetch closed, a decode's worker process killed): nobody would see its result. A failure is handed to everyone waiting at that moment and
never remembered: the next call starts afresh. The entry is removed when the task ends, however
it ends. Entries are bounded by the number of distinct keys being loaded right now.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class InflightMap(Generic[K, V]):
    """Map of key → the one task currently producing that key's value."""

    def __init__(self) -> None:
        self._tasks: dict[K, asyncio.Task[V]] = {}
        self._waiters: dict[asyncio.Task[V], int] = {}

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, key: object) -> bool:
        return key in self._tasks

    async def run(self, key: K, work: Callable[[], Awaitable[V]]) -> tuple[V, bool]:
        """The value of ``work()`` for ``key``, started once for all concurrent callers.

        Returns ``(value, joined)``: ``joined`` is True when this caller shared a fetch another
        caller had started. ``work``'s exception is raised to every caller sharing it.
        """
        task = self._tasks.get(key)
        joined = task is not None
        if task is None:
            task = asyncio.create_task(_as_coroutine(work))
            self._tasks[key] = task
            task.add_done_callback(functools.partial(self._forget, key))
        self._waiters[task] = self._waiters.get(task, 0) + 1
        try:
            return await asyncio.shield(task), joined
        finally:
            left = self._waiters.pop(task) - 1
            if left:
                self._waiters[task] = left
            elif not task.done():  # the last waiter went away (cancelled): nobody needs the value
                task.cancel()

    def _forget(self, key: K, task: asyncio.Task[V]) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]
        if not task.cancelled():
            task.exception()  # mark it retrieved: every waiter may have gone (no "never retrieved")

    async def close(self) -> None:
        """Cancel every running fetch and wait for them to finish."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()


async def _as_coroutine(work: Callable[[], Awaitable[V]]) -> V:
    return await work()
