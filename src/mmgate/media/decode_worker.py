"""One image decode process (``mmgate.media.decode_procs`` runs a pool of them): what runs in the
process, and the parent's handle on it (its CPU time, its priority, killing it)."""

from __future__ import annotations

import contextlib
import os
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from mmgate.errors import MediaError
from mmgate.heap import keep_request_buffers
from mmgate.media.validate import validate_image

LOWEST_PRIORITY = 19
READY = b"ready"
# A process's start may import the parent's main script first (CPython 3.11's forkserver does not
# preload it, whatever ``set_forkserver_preload`` says): seconds on a loaded machine.
READY_TIMEOUT_S = 30.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def serve(conn: Connection) -> None:
    """A worker: validate each image it is sent until its parent closes the pipe."""
    keep_request_buffers()
    conn.send_bytes(READY)  # started: what it imported to get here is not charged to a decode
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


class Worker:
    """One decode process and the parent's end of its pipe."""

    __slots__ = ("conn", "lowered", "process")

    def __init__(self, process: BaseProcess, conn: Connection) -> None:
        self.process = process
        self.conn = conn
        self.lowered = False  # at the lowest CPU priority: replaced once its decode ends

    @classmethod
    def started(cls, process: BaseProcess, conn: Connection) -> Worker:
        """The worker once its process says it is ready (blocking, ``READY_TIMEOUT_S`` at most):
        the CPU a decode is charged is counted from then. OSError (the process killed) otherwise."""
        worker = cls(process, conn)
        try:
            if conn.poll(READY_TIMEOUT_S) and conn.recv_bytes() == READY:
                return worker
        except (EOFError, OSError):
            pass
        worker.kill()
        raise OSError(f"the image decode process did not start within {READY_TIMEOUT_S:g} s")

    def cpu_seconds(self) -> float | None:
        """CPU time the worker has used (user and system), or None where it cannot be read."""
        try:
            fields = Path(f"/proc/{self.process.pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            return None
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def lower_priority(self) -> None:
        if self.lowered or self.process.pid is None:
            return
        self.lowered = True
        with contextlib.suppress(OSError):  # gone already, or not allowed: the decode still ends
            os.setpriority(os.PRIO_PROCESS, self.process.pid, LOWEST_PRIORITY)

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.close()
        self.process.kill()
        self.process.join(timeout=0)  # reaped now or by multiprocessing at the next start


def send(conn: Connection, data: bytes, header: tuple[tuple[str, ...], int]) -> None:
    conn.send_bytes(data)
    conn.send(header)
