"""Full image decodes in worker processes that can be abandoned, shared fairly between tenants.

A decode thread cannot be stopped: a client that goes away, or an image whose decode costs far more
than its pixels promise, would hold a thread and a CPU to the end. Here each decode runs in a
worker process (``forkserver``: Pillow is imported once, in the server), and:

* a decode that is cancelled (every request waiting for it went away) or runs past
  ``time_limit_s`` is abandoned: its worker is killed and a fresh one is started on demand, so the
  work stops at once (a timeout is the client's 415: the image costs too much to decode);
* a decode whose worker has used more CPU than ``cpu_budget_s(pixels)`` (the image's pixels, from
  its header) is abandoned the same way and the image refused (415): what it costs is out of
  proportion to what it shows, so a backend must not decode it either. The budget is checked when
  it could first have been spent (wall time ≥ CPU time) and again when it could next be;
* a decode that has used ``slow_after_s`` of CPU is moved to the lowest CPU priority (and its
  worker replaced when it ends: a process cannot raise its priority back), so a costly image takes
  the CPU the others leave; a ``low_priority`` decode (a large image) starts there. CPU, not wall
  time: on a loaded machine a small image waits for the CPU too, and must not be sent to the back
  for it (where the process's CPU time cannot be read, wall time stands in);
* with tenants, one tenant runs at most ``workers - 1`` decodes at once (when ``workers`` > 1), so
  another tenant always finds a worker free or freed by its own next decode, and waiting decodes are
  started tenant by tenant in turn, not in arrival order.

Only the image bytes go to the worker and only ``ImageInfo`` (or the refusal) comes back.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mmgate.errors import ImageTooLargeError, MediaError, UnsupportedImageError
from mmgate.media.decode_worker import Worker, send, serve
from mmgate.media.metrics import AbandonReason
from mmgate.media.validate import ImageInfo

log = logging.getLogger(__name__)

_REFUSALS: dict[str, type[MediaError]] = {
    "ImageTooLargeError": ImageTooLargeError, "UnsupportedImageError": UnsupportedImageError,
}


class _OverBudget(Exception):
    """The cause of a refusal for a decode past its CPU budget (tells the abandon reason apart)."""


# An image this small is written to its worker from the event loop: far below a local socket's
# send buffer, so the write completes at once whether or not the worker reads yet.
_INLINE_SEND_BYTES = 32 * 1024


class DecodeProcesses:
    """The pool of decode workers (module docstring): at most ``workers``, from ``start`` or on demand."""

    def __init__(self, workers: int, *, time_limit_s: float, slow_after_s: float,
                 cpu_budget_s: Callable[[int], float] | None = None,
                 on_abandon: Callable[[AbandonReason], None] | None = None) -> None:
        self.workers = workers
        self.cpu_budget_s = cpu_budget_s  # CPU seconds a decode of so many pixels may use (None: any)
        self._on_abandon = on_abandon
        self.time_limit_s = time_limit_s
        self.slow_after_s = slow_after_s
        self._ctx = multiprocessing.get_context("forkserver")
        # "__main__" would have the server import the main script once for all its children;
        # CPython 3.11 drops it (``Worker.started`` waits for a child that imports it itself).
        self._ctx.set_forkserver_preload(["__main__", "mmgate.media.decode_worker"])
        # The server itself starts now, in the background: the first decode only forks.
        threading.Thread(target=multiprocessing.forkserver.ensure_running, name="mmgate-forkserver-start",
                         daemon=True).start()
        self._idle: list[Worker] = []
        self._live = 0  # workers started or starting, not yet killed
        # Sends of big images and worker starts: threads of the pool's own (the loop's default
        # executor is shared, and a send waits for its worker to read).
        self._io = ThreadPoolExecutor(max_workers=workers + 2, thread_name_prefix="mmgate-decode-io")
        self._refills: set[asyncio.Task[None]] = set()
        self._busy = 0  # slots handed out (a worker running or being started)
        self._running: dict[str | None, int] = {}
        self._waiting: OrderedDict[str | None, deque[asyncio.Future[None]]] = OrderedDict()
        self.abandoned = 0  # decodes killed (cancelled or past the time limit)
        self._closed = False

    @property
    def tenant_cap(self) -> int:
        return max(1, self.workers - 1)

    @property
    def live_workers(self) -> int:
        """Workers started or starting and not killed yet (at most ``workers``)."""
        return self._live

    async def validate(self, tenant: str | None, data: bytes, allowed_formats: tuple[str, ...], max_pixels: int,
                       *, pixels: int, low_priority: bool = False) -> ImageInfo:
        """``validate_image(data, …)`` in a worker; ``tenant`` (its tag, or None without tenants)
        decides its turn, ``pixels`` (from the image's header) its CPU budget. Raises the worker's
        refusal, or ``UnsupportedImageError`` past the time limit or the CPU budget."""
        await self._acquire(tenant)
        worker: Worker | None = None
        try:
            worker = self._idle.pop() if self._idle else await self._spawn()
            if low_priority:
                worker.lower_priority()
            reply = await self._decode(worker, data, allowed_formats, max_pixels, pixels)
        except BaseException as exc:
            if worker is not None:
                self._kill(worker)
                worker = None
                self._abandoned(exc)
            raise
        finally:
            self._release(tenant, worker)
        if reply[0] == "ok":
            info: ImageInfo = reply[1]
            return info
        raise _REFUSALS.get(reply[1], UnsupportedImageError)(reply[2])

    def _abandoned(self, exc: BaseException) -> None:
        self.abandoned += 1
        if self._on_abandon is not None:
            cause = exc.__cause__
            reason: AbandonReason = "cancelled" if isinstance(exc, asyncio.CancelledError) else (
                "died" if isinstance(cause, (EOFError, OSError)) else
                "cpu_budget" if isinstance(cause, _OverBudget) else "time_limit")
            self._on_abandon(reason)

    async def _decode(self, worker: Worker, data: bytes, allowed: tuple[str, ...], max_pixels: int,
                      pixels: int) -> Any:
        loop = asyncio.get_running_loop()
        replied: asyncio.Future[None] = loop.create_future()
        fd = worker.conn.fileno()
        watching = False
        slow: asyncio.TimerHandle | None = None
        budget_check: asyncio.TimerHandle | None = None
        decoding: asyncio.Future[None] = loop.create_future()  # done when this decode ends, however
        over_budget: asyncio.Future[float] = loop.create_future()  # set to the CPU used, past the budget
        try:
            if len(data) <= _INLINE_SEND_BYTES:  # fits the socket's buffer: the write never waits
                send(worker.conn, data, (allowed, max_pixels))
            else:  # a big image fills it before the worker reads: sent from a thread of our own
                await loop.run_in_executor(self._io, send, worker.conn, data, (allowed, max_pixels))
            cpu_at_start = worker.cpu_seconds()
            slow = loop.call_later(self.slow_after_s, self._check_slow, worker, cpu_at_start, decoding)
            if self.cpu_budget_s is not None and cpu_at_start is not None:
                budget = self.cpu_budget_s(pixels)
                budget_check = loop.call_later(budget, self._check_budget, worker, cpu_at_start, budget, over_budget)
            # Watched only once sent: an event loop may make a watched socket non-blocking (uvloop
            # does), and the send from a thread must block until the worker has read it all.
            loop.add_reader(fd, _set_once, replied)
            watching = True
            await asyncio.wait((replied, over_budget), timeout=self.time_limit_s,
                               return_when=asyncio.FIRST_COMPLETED)
            if not replied.done() and over_budget.done():
                raise UnsupportedImageError(
                    f"the image costs far more to decode than its {pixels} pixels justify "
                    f"(over {over_budget.result():.2g} s of CPU): re-encode it (a baseline JPEG or a plain PNG)"
                ) from _OverBudget()
            if not replied.done():
                raise UnsupportedImageError(
                    f"the image took more than {self.time_limit_s:g} s to decode: re-encode it "
                    "(a baseline JPEG or a plain PNG)")
            loop.remove_reader(fd)
            watching = False
            os.set_blocking(fd, True)  # the reply is there: read whole, and the next send blocks again
            return worker.conn.recv()
        except (EOFError, OSError) as exc:  # the worker died (killed by the OS: memory)
            log.warning("an image decode process failed (%s: %s); it is replaced", type(exc).__name__, exc,
                        exc_info=log.isEnabledFor(logging.DEBUG))
            raise UnsupportedImageError("the image could not be decoded (its decoder ran out of resources)") from exc
        finally:
            decoding.set_result(None)
            if slow is not None:
                slow.cancel()
            if budget_check is not None:
                budget_check.cancel()
            if not over_budget.done():
                over_budget.cancel()  # stops a check already rescheduled
            if watching:
                loop.remove_reader(fd)

    def _check_slow(self, worker: Worker, cpu_at_start: float | None, done: asyncio.Future[None]) -> None:
        """Lower ``worker``'s priority once its decode has used ``slow_after_s`` of CPU (module
        docstring); until then look again every ``slow_after_s`` while the decode runs."""
        if done.done():
            return
        cpu = worker.cpu_seconds()
        if cpu is None or cpu_at_start is None or cpu - cpu_at_start >= self.slow_after_s:
            worker.lower_priority()
            return
        asyncio.get_running_loop().call_later(self.slow_after_s, self._check_slow, worker, cpu_at_start, done)

    def _check_budget(self, worker: Worker, cpu_at_start: float, budget: float,
                      over: asyncio.Future[float]) -> None:
        """Set ``over`` once the decode has used ``budget`` CPU seconds (module docstring); until
        then look again when the rest could have been spent. Unreadable CPU: the time limit holds."""
        if over.done():
            return
        cpu = worker.cpu_seconds()
        if cpu is None:
            return
        used = cpu - cpu_at_start
        if used >= budget:
            over.set_result(used)
            return
        asyncio.get_running_loop().call_later(max(budget - used, 0.01), self._check_budget, worker, cpu_at_start,
                                              budget, over)

    async def _spawn(self) -> Worker:
        """A fresh worker, started from a thread (forking from the server takes milliseconds; the
        first start launches the server). One started for a waiter that went away is killed."""
        self._live += 1
        started = asyncio.ensure_future(asyncio.get_running_loop().run_in_executor(self._io, self._start))
        try:
            return await asyncio.shield(started)
        except asyncio.CancelledError:
            started.add_done_callback(self._kill_unclaimed)
            raise
        except BaseException:
            self._live -= 1
            raise

    def _kill_unclaimed(self, started: asyncio.Future[Worker]) -> None:
        if not started.cancelled() and started.exception() is None:
            self._kill(started.result())
        else:
            self._live -= 1

    def _kill(self, worker: Worker) -> None:
        """Kill ``worker`` and start its replacement now (in the background), so the next decode
        finds a worker waiting instead of starting one."""
        worker.kill()
        self._live -= 1
        if not self._closed and self._live < self.workers:
            self._start_spare()

    async def start(self, timeout_s: float) -> int:
        """Start the workers not started yet and wait for them, at most ``timeout_s``, so the first
        decodes find them idle; returns how many are. One that fails to start is logged (a decode
        then starts its own); one still starting at the deadline joins the pool once up."""
        for _ in range(self.workers - self._live):
            self._start_spare()
        if self._refills:
            await asyncio.wait(set(self._refills), timeout=timeout_s)
        return len(self._idle)

    def _start_spare(self) -> None:
        task = asyncio.ensure_future(self._refill())
        self._refills.add(task)
        task.add_done_callback(self._refills.discard)

    async def _refill(self) -> None:
        try:
            worker = await self._spawn()
        except Exception:  # could not start one: the next decode starts its own (and reports why)
            log.warning("could not start an image decode process", exc_info=True)
            return
        if self._closed or self._live > self.workers:
            self._kill(worker)
        else:
            self._idle.append(worker)

    def _start(self) -> Worker:
        parent, child = self._ctx.Pipe()
        process = self._ctx.Process(target=serve, args=(child,), name="mmgate-decode", daemon=True)
        process.start()
        child.close()
        return Worker.started(process, parent)

    async def _acquire(self, tenant: str | None) -> None:
        if self._closed:
            raise UnsupportedImageError("the gateway is shutting down; retry the request")
        if tenant not in self._waiting and self._may_start(tenant):  # others waiting are at their cap
            self._take(tenant)
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(tenant, deque()).append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._release(tenant, None)  # given a slot just as its waiter went away
            else:
                queue = self._waiting.get(tenant)
                if queue is not None and turn in queue:
                    queue.remove(turn)
                    if not queue:
                        del self._waiting[tenant]
            raise

    def _may_start(self, tenant: str | None) -> bool:
        if self._busy >= self.workers:
            return False
        return tenant is None or self._running.get(tenant, 0) < self.tenant_cap

    def _take(self, tenant: str | None) -> None:
        self._busy += 1
        self._running[tenant] = self._running.get(tenant, 0) + 1

    def _release(self, tenant: str | None, worker: Worker | None) -> None:
        self._busy -= 1
        left = self._running[tenant] - 1
        if left:
            self._running[tenant] = left
        else:
            del self._running[tenant]
        if worker is not None:
            if worker.lowered or self._closed or self._live > self.workers:
                self._kill(worker)  # at the lowest priority for good (or one too many): replaced
            else:
                self._idle.append(worker)
        self._dispatch()

    def _dispatch(self) -> None:
        """Start waiting decodes, one tenant after another (each moved to the back once served)."""
        for tenant in list(self._waiting):
            if self._busy >= self.workers:
                return
            if not self._may_start(tenant):
                continue
            queue = self._waiting.pop(tenant)
            while queue and queue[0].done():  # a waiter cancelled before it could leave the queue
                queue.popleft()
            if not queue:
                continue
            turn = queue.popleft()
            if queue:
                self._waiting[tenant] = queue  # to the back of the rotation
            self._take(tenant)
            turn.set_result(None)

    def close(self) -> None:
        """Kill every idle worker; busy ones are killed when their decode returns."""
        self._closed = True
        for worker in self._idle:
            self._kill(worker)
        self._idle.clear()
        for task in self._refills:
            task.cancel()
        self._io.shutdown(wait=False, cancel_futures=True)


def _set_once(replied: asyncio.Future[None]) -> None:
    if not replied.done():
        replied.set_result(None)
