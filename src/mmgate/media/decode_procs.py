"""Full image decodes in worker processes that can be abandoned, shared fairly between tenants.

A decode thread cannot be stopped: a client that goes away, or an image whose decode costs far more
than its pixels promise, would hold a thread and a CPU to the end. Here each decode runs in a
worker process (``forkserver``: Pillow is imported once, in the server), and:

* a decode that is cancelled (every request waiting for it went away) or runs past
  ``time_limit_s`` is abandoned: its worker is killed and a fresh one is started on demand, so the
  work stops at once (a timeout is the client's 415: the image costs too much to decode);
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
import contextlib
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from mmgate.errors import ImageTooLargeError, MediaError, UnsupportedImageError
from mmgate.media.metrics import AbandonReason
from mmgate.media.validate import ImageInfo, validate_image

log = logging.getLogger(__name__)

_REFUSALS: dict[str, type[MediaError]] = {
    "ImageTooLargeError": ImageTooLargeError, "UnsupportedImageError": UnsupportedImageError,
}
_LOWEST_PRIORITY = 19
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# An image this small is written to its worker from the event loop: far below a local socket's
# send buffer, so the write completes at once whether or not the worker reads yet.
_INLINE_SEND_BYTES = 32 * 1024


def _serve(conn: Connection) -> None:
    """A worker: validate each image it is sent until its parent closes the pipe."""
    while True:
        try:
            data = conn.recv_bytes()
            allowed, max_pixels = conn.recv()
        except (EOFError, OSError):  # the parent closed its end or died: nothing more to do
            return
        try:
            reply: tuple[Any, ...] = ("ok", validate_image(data, allowed_formats=allowed, max_pixels=max_pixels))
        except MediaError as exc:
            reply = ("refused", type(exc).__name__, exc.message)
        except Exception as exc:  # anything else Pillow raises is the image's fault too
            reply = ("refused", "UnsupportedImageError", f"the image cannot be decoded ({type(exc).__name__})")
        conn.send(reply)


class _Worker:
    __slots__ = ("conn", "lowered", "process")

    def __init__(self, process: BaseProcess, conn: Connection) -> None:
        self.process = process
        self.conn = conn
        self.lowered = False  # at the lowest CPU priority: replaced once its decode ends

    def cpu_seconds(self) -> float | None:
        """CPU time the worker has used (user and system), or None where it cannot be read."""
        try:
            fields = Path(f"/proc/{self.process.pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            return None
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS

    def lower_priority(self) -> None:
        if self.lowered or self.process.pid is None:
            return
        self.lowered = True
        with contextlib.suppress(OSError):  # gone already, or not allowed: the decode still ends
            os.setpriority(os.PRIO_PROCESS, self.process.pid, _LOWEST_PRIORITY)

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.close()
        self.process.kill()
        self.process.join(timeout=0)  # reaped now or by multiprocessing at the next start


class DecodeProcesses:
    """The pool of decode workers (module docstring). Workers start on demand, at most ``workers``."""

    def __init__(self, workers: int, *, time_limit_s: float, slow_after_s: float,
                 on_abandon: Callable[[AbandonReason], None] | None = None) -> None:
        self.workers = workers
        self._on_abandon = on_abandon
        self.time_limit_s = time_limit_s
        self.slow_after_s = slow_after_s
        self._ctx = multiprocessing.get_context("forkserver")
        # "__main__": the server imports the main script once, so its children do not each
        # import it again (multiprocessing's preparation skips a main the process already has).
        self._ctx.set_forkserver_preload(["__main__", "mmgate.media.validate"])
        # The server itself starts now, in the background: the first decode only forks.
        threading.Thread(target=multiprocessing.forkserver.ensure_running, name="mmgate-forkserver-start",
                         daemon=True).start()
        self._idle: list[_Worker] = []
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

    async def validate(self, tenant: str | None, data: bytes, allowed_formats: tuple[str, ...], max_pixels: int,
                       *, low_priority: bool = False) -> ImageInfo:
        """``validate_image(data, …)`` in a worker; ``tenant`` (its tag, or None without tenants)
        decides its turn. Raises the worker's refusal, or ``UnsupportedImageError`` past the time limit."""
        await self._acquire(tenant)
        worker: _Worker | None = None
        try:
            worker = self._idle.pop() if self._idle else await self._spawn()
            if low_priority:
                worker.lower_priority()
            reply = await self._decode(worker, data, allowed_formats, max_pixels)
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
                "died" if isinstance(cause, (EOFError, OSError)) else "time_limit")
            self._on_abandon(reason)

    async def _decode(self, worker: _Worker, data: bytes, allowed: tuple[str, ...], max_pixels: int) -> Any:
        loop = asyncio.get_running_loop()
        replied: asyncio.Future[None] = loop.create_future()
        fd = worker.conn.fileno()
        watching = False
        slow: asyncio.TimerHandle | None = None
        decoding: asyncio.Future[None] = loop.create_future()  # done when this decode ends, however
        try:
            if len(data) <= _INLINE_SEND_BYTES:  # fits the socket's buffer: the write never waits
                _send(worker.conn, data, (allowed, max_pixels))
            else:  # a big image fills it before the worker reads: sent from a thread of our own
                await loop.run_in_executor(self._io, _send, worker.conn, data, (allowed, max_pixels))
            slow = loop.call_later(self.slow_after_s, self._check_slow, worker, worker.cpu_seconds(), decoding)
            # Watched only once sent: an event loop may make a watched socket non-blocking (uvloop
            # does), and the send from a thread must block until the worker has read it all.
            loop.add_reader(fd, _set_once, replied)
            watching = True
            try:
                await asyncio.wait_for(asyncio.shield(replied), self.time_limit_s)
            except TimeoutError:
                raise UnsupportedImageError(
                    f"the image took more than {self.time_limit_s:g} s to decode: re-encode it "
                    "(a baseline JPEG or a plain PNG)") from None
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
            if watching:
                loop.remove_reader(fd)

    def _check_slow(self, worker: _Worker, cpu_at_start: float | None, done: asyncio.Future[None]) -> None:
        """Lower ``worker``'s priority once its decode has used ``slow_after_s`` of CPU (module
        docstring); until then look again every ``slow_after_s`` while the decode runs."""
        if done.done():
            return
        cpu = worker.cpu_seconds()
        if cpu is None or cpu_at_start is None or cpu - cpu_at_start >= self.slow_after_s:
            worker.lower_priority()
            return
        asyncio.get_running_loop().call_later(self.slow_after_s, self._check_slow, worker, cpu_at_start, done)

    async def _spawn(self) -> _Worker:
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

    def _kill_unclaimed(self, started: asyncio.Future[_Worker]) -> None:
        if not started.cancelled() and started.exception() is None:
            self._kill(started.result())
        else:
            self._live -= 1

    def _kill(self, worker: _Worker) -> None:
        """Kill ``worker`` and start its replacement now (in the background), so the next decode
        finds a worker waiting instead of starting one."""
        worker.kill()
        self._live -= 1
        if not self._closed and self._live < self.workers:
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

    def _start(self) -> _Worker:
        parent, child = self._ctx.Pipe()
        process = self._ctx.Process(target=_serve, args=(child,), name="mmgate-decode", daemon=True)
        process.start()
        child.close()
        return _Worker(process, parent)

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

    def _release(self, tenant: str | None, worker: _Worker | None) -> None:
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


def _send(conn: Connection, data: bytes, header: tuple[tuple[str, ...], int]) -> None:
    conn.send_bytes(data)
    conn.send(header)
