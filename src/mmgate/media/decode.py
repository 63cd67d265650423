"""Where image validation work runs, and how much of it a request may ask for or leave queued.

* Two lanes of threads. Images of at most ``large_image_pixels`` decode in the normal lane
  (``decode_workers`` threads); larger ones in a lane of their own (one thread, at the lowest CPU
  priority), so one client's giant images never queue ahead of everybody's small ones nor take the
  CPU from them.
* The large lane's queue is bounded in pixels, queued and running together
  (``max_decode_queue_pixels``): past it a request gets ``BusyError`` (429 with ``Retry-After``)
  instead of waiting behind work it cannot see. A single image is always admitted to an empty lane.
* ``PixelBudget``: the pixels decoded for one request (``max_request_pixels``); past it, 400 before
  the image that would cross it is decoded. Cached images cost nothing: they are not decoded again.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from mmgate.errors import BusyError, ImageTooLargeError

_T = TypeVar("_T")


def _lower_priority() -> None:
    """Run this (large-lane) thread at the lowest CPU priority: on a busy machine the event loop
    and the normal lane come first, so giant decodes take the CPU that is left over."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # Linux: per thread
    except (AttributeError, OSError):  # not Linux, or not allowed: the lane still works
        pass


class PixelBudget:
    """The pixels one request may have decoded (shared by its images' loads)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def charge(self, pixels: int) -> None:
        """Count ``pixels`` or raise ``ImageTooLargeError`` (400) when they would cross the limit."""
        if self.used + pixels > self.limit:
            raise ImageTooLargeError(
                f"the request's images need more than {self.limit} pixels decoded (this one: {pixels}); "
                "the per-request limit is --max-request-pixels: send fewer or smaller images"
            )
        self.used += pixels


class DecodeLanes:
    """The normal and the large decode lane (module docstring)."""

    def __init__(self, *, workers: int, large_image_pixels: int, max_queue_pixels: int) -> None:
        self._normal = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mmgate-media")
        self._large = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmgate-media-large",
                                         initializer=_lower_priority)
        self.large_image_pixels = large_image_pixels
        self.max_queue_pixels = max_queue_pixels
        self._queued = 0  # pixels submitted to the large lane and not finished (queued + running)
        self._lock = threading.Lock()  # released from worker threads

    @property
    def queued_large_pixels(self) -> int:
        return self._queued

    async def run(self, pixels: int, fn: Callable[..., _T], *args: object) -> _T:
        """Run ``fn(*args)`` in the lane for an image of ``pixels`` (0: lane-less small work)."""
        if pixels <= self.large_image_pixels:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._normal, functools.partial(fn, *args))
        with self._lock:
            if self._queued and self._queued + pixels > self.max_queue_pixels:
                raise BusyError(
                    f"the gateway's queue of large-image decodes is full ({self._queued} pixels waiting); "
                    "retry shortly"
                )
            self._queued += pixels
        future: Future[_T] = self._large.submit(fn, *args)
        # Released when the job ends (or is cancelled unstarted), not when its waiter gives up:
        # a running decode still occupies the lane.
        future.add_done_callback(functools.partial(self._release, pixels))
        return await asyncio.wrap_future(future)

    def _release(self, pixels: int, _future: object) -> None:
        with self._lock:
            self._queued -= pixels

    def shutdown(self) -> None:
        self._normal.shutdown(wait=False, cancel_futures=True)
        self._large.shutdown(wait=False, cancel_futures=True)
