"""Where image validation work runs, and how much of it a request may ask for or leave queued.

* Two lanes. Images of at most ``large_image_pixels`` decode in the normal lane (up to
  ``decode_workers`` processes at once); larger ones one at a time, in a process at the lowest CPU
  priority, so one client's giant images never queue ahead of everybody's small ones nor take the
  CPU from them. The lighter work around a decode (base64, hashes, header probes) runs in
  ``decode_workers`` threads (``run``; a lane of one low-priority thread for large work), but
  for a screenshot-sized PNG, checked on the loader's event loop (``checks.checked_inline``).
* The large lane's queue is bounded in pixels, queued and running together
  (``max_decode_queue_pixels``): past it a request gets ``BusyError`` (429 with ``Retry-After``)
  instead of waiting behind work it cannot see. A request is admitted whole or not at all
  (``PixelBudget.admit``): once each of its loads has probed its image (or found it cached, or
  joined another's load), the large pixels of all of them are reserved in one step, or the
  request gets its 429 before any of its images is decoded. Any one request is admitted to an
  empty lane.
* ``PixelBudget``: the pixels decoded for one request (``max_request_pixels``); past it, 400 before
  the image that would cross it is decoded. Cached images cost nothing: they are not decoded again.
* The full decode itself (Pillow) runs in worker processes (``mmgate.media.decode_procs``),
  started before the gateway accepts requests (``start``): a decode nobody waits for any more, one
  past ``DECODE_TIME_LIMIT_S``, or one past the CPU its pixels justify (``decode_cpu_budget_s``) is
  killed (and its process replaced), and tenants take turns.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from mmgate.app_runtime import lower_thread_priority
from mmgate.errors import BusyError, ImageTooLargeError
from mmgate.media.decode_procs import DecodeProcesses
from mmgate.media.metrics import AbandonReason
from mmgate.media.validate import ImageInfo

log = logging.getLogger(__name__)
_T = TypeVar("_T")
# A decode past this is abandoned (its worker killed) and the image refused (415). Real images of
# the largest accepted size decode in a second or two; only a decode bomb, or a machine so loaded
# that the request would time out anyway, comes near it.
DECODE_TIME_LIMIT_S = 20.0
# A decode that has used this much CPU is moved to the lowest CPU priority (a 4-megapixel JPEG
# decodes in ~50 ms: what costs more is large or costly, and must not take the CPU from the rest).
SLOW_DECODE_S = 0.5
# A decode may use this much CPU per pixel of its image, plus the floor, before it is abandoned and
# the image refused (415): over 10 times the costliest ordinary image (lossy WEBP of noise; the
# per-format costs are measured by benchmarks/regression/decode_bombs.py, PERFORMANCE.md "Decode bombs"). The
# floor covers a worker's fixed costs and the CPU clock's 10 ms ticks, so no small image nears it.
DECODE_CPU_PER_PIXEL_S = 600e-9
DECODE_CPU_FLOOR_S = 0.25
# How long start-up waits for the decode processes (``DecodeLanes.start``). The first start imports
# Pillow in the forkserver: under a second on an idle core, a few on a loaded machine; a start
# still running past this goes on in the background, and the gateway serves meanwhile.
PROCESSES_START_S = 15.0


def decode_cpu_budget_s(pixels: int) -> float:
    """CPU seconds the full decode of an image of ``pixels`` may use (constants above)."""
    return DECODE_CPU_FLOOR_S + pixels * DECODE_CPU_PER_PIXEL_S


class PixelBudget:
    """The pixels one request may have decoded (shared by its images' loads), and its admission
    to the large lane: ``expected`` loads each report once, through ``admit`` (an image to decode)
    or ``stand_aside`` (cached, joined, failed or cancelled), and the lane is asked once, for the
    sum, when the last has reported."""

    def __init__(self, limit: int, lanes: DecodeLanes | None = None, expected: int = 0) -> None:
        self.limit = limit
        self.used = 0
        self._lanes = lanes
        self._unreported = expected
        self._reported: set[object] = set()
        self._asked: dict[object, int] = {}  # load → large pixels it waits to have reserved
        self._decision: asyncio.Future[None] | None = None
        if lanes is not None and expected > 0:  # built in the event loop, by the request's handler
            self._decision = asyncio.get_running_loop().create_future()
            self._decision.add_done_callback(_retrieve)

    def charge(self, pixels: int) -> None:
        """Count ``pixels`` or raise ``ImageTooLargeError`` (400) when they would cross the limit."""
        if self.used + pixels > self.limit:
            raise ImageTooLargeError(
                f"the request's images need more than {self.limit} pixels decoded (this one: {pixels}); "
                "the per-request limit is --max-request-pixels: send fewer or smaller images"
            )
        self.used += pixels

    async def admit(self, load: object, pixels: int) -> bool:
        """Wait until the request's large decodes are admitted together; True when ``pixels`` are
        now reserved in the large lane for this load (it must run or release them), False when the
        image goes to the normal lane. Raises ``BusyError`` (429) when the request is refused."""
        lanes = self._lanes
        if lanes is None or pixels <= lanes.large_image_pixels:
            self.stand_aside(load)
            return False
        if load in self._reported or self._decision is None or self._decision.done():
            lanes.reserve(pixels)  # not part of the request's admission (too late): on its own
            return True
        self._reported.add(load)
        self._unreported -= 1
        self._asked[load] = pixels
        decision = self._decision
        self._decide()
        try:
            await asyncio.shield(decision)
        except asyncio.CancelledError:
            if self._asked.pop(load, None) is None and decision.done() and not decision.cancelled() \
                    and decision.exception() is None:
                lanes.release(pixels)  # reserved for a load that is gone
            raise
        self._asked.pop(load, None)
        return True

    def stand_aside(self, load: object) -> None:
        """``load`` decodes nothing of its own (cached, joined, failed or cancelled). Idempotent."""
        if load in self._reported:
            return
        self._reported.add(load)
        self._unreported -= 1
        self._decide()

    def abandon(self) -> None:
        """The request stopped loading (failed or cancelled): loads that never reported stand aside,
        so a load shared with other requests is not left waiting for them."""
        self._unreported = 0
        self._decide()

    def _decide(self) -> None:
        decision = self._decision
        if decision is None or decision.done() or self._unreported > 0:
            return
        assert self._lanes is not None
        total = sum(self._asked.values())
        try:
            if total:
                self._lanes.reserve(total)
        except BusyError as exc:
            decision.set_exception(exc)
            return
        self._asked.clear()  # reserved: each load now holds its share
        decision.set_result(None)


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()  # a refusal nobody waits for any more is not "never retrieved"


class LoadTicket:
    """One ``MediaLoader.load`` call's place in its request's ``PixelBudget`` admission."""

    __slots__ = ("budget",)

    def __init__(self, budget: PixelBudget) -> None:
        self.budget = budget

    def stand_aside(self) -> None:
        self.budget.stand_aside(self)


class DecodeLanes:
    """The normal and the large decode lane (module docstring)."""

    def __init__(self, *, workers: int, large_image_pixels: int, max_queue_pixels: int,
                 on_abandon: Callable[[AbandonReason], None] | None = None) -> None:
        self._normal = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mmgate-media")
        self._large = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmgate-media-large",
                                         initializer=lower_thread_priority)
        self.large_image_pixels = large_image_pixels
        self.max_queue_pixels = max_queue_pixels
        self._queued = 0  # pixels submitted to the large lane and not finished (queued + running)
        self._lock = threading.Lock()  # released from worker threads
        self.processes = DecodeProcesses(workers, time_limit_s=DECODE_TIME_LIMIT_S, slow_after_s=SLOW_DECODE_S,
                                         cpu_budget_s=decode_cpu_budget_s, on_abandon=on_abandon)
        self._large_turn = asyncio.Semaphore(1)  # large decodes: one at a time

    async def start(self) -> None:
        """Start the decode processes, and wait for them (at most ``PROCESSES_START_S``), so that
        the first images decode at once instead of waiting for a process to start."""
        ready = await self.processes.start(PROCESSES_START_S)
        if ready < self.processes.workers:
            log.warning("%d of %d image decode processes ready after start-up; the first decodes may wait "
                        "for the others", ready, self.processes.workers)

    @property
    def queued_large_pixels(self) -> int:
        return self._queued

    async def run(self, pixels: int, fn: Callable[..., _T], *args: object, reserved: bool = False) -> _T:
        """Run ``fn(*args)`` in the lane for an image of ``pixels`` (0: lane-less small work).
        ``reserved``: the pixels were reserved already (``PixelBudget.admit``)."""
        if pixels <= self.large_image_pixels:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._normal, functools.partial(fn, *args))
        if not reserved:
            self.reserve(pixels)
        try:
            future: Future[_T] = self._large.submit(fn, *args)
        except BaseException:
            self.release(pixels)
            raise
        # Released when the job ends (or is cancelled unstarted), not when its waiter gives up:
        # a running decode still occupies the lane.
        future.add_done_callback(functools.partial(self._release, pixels))
        return await asyncio.wrap_future(future)

    async def decode(self, pixels: int, tenant: str | None, data: bytes, allowed_formats: tuple[str, ...],
                     max_pixels: int, *, reserved: bool = False) -> ImageInfo:
        """The full decode of an image of ``pixels`` (``validate_image``) in a worker process, for
        ``tenant`` (its tag; None without tenants). ``reserved``: as for ``run``."""
        if pixels <= self.large_image_pixels:
            return await self.processes.validate(tenant, data, allowed_formats, max_pixels, pixels=pixels)
        if not reserved:
            self.reserve(pixels)
        try:
            async with self._large_turn:
                return await self.processes.validate(tenant, data, allowed_formats, max_pixels, pixels=pixels,
                                                     low_priority=True)
        finally:
            self.release(pixels)

    def reserve(self, pixels: int) -> None:
        """Count ``pixels`` into the large lane's queue, or raise ``BusyError`` when they do not fit
        (an empty lane takes anything)."""
        with self._lock:
            if self._queued and self._queued + pixels > self.max_queue_pixels:
                raise BusyError(
                    f"the gateway's queue of large-image decodes is full ({self._queued} pixels waiting); "
                    "retry shortly"
                )
            self._queued += pixels

    def release(self, pixels: int) -> None:
        """Give back reserved pixels that will not be decoded."""
        self._release(pixels, None)

    def _release(self, pixels: int, _future: object) -> None:
        with self._lock:
            self._queued -= pixels

    def shutdown(self) -> None:
        self.processes.close()
        self._normal.shutdown(wait=False, cancel_futures=True)
        self._large.shutdown(wait=False, cancel_futures=True)
