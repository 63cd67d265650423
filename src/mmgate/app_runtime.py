"""Serving helpers shared by the gateway, ``sim`` and ``bench``: the event loop (uvloop), starting
an aiohttp app, running until a signal, stopping background tasks within a bound, JSON responses,
and the aiohttp server logger that keeps a client's malformed HTTP out of the error log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Awaitable, Callable
from typing import Any, cast

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

log = logging.getLogger(__name__)

JSON_CONTENT_TYPE = "application/json"


def install_uvloop() -> bool:
    """Use uvloop's event loop when it is installed (about half the per-request CPU of asyncio's)."""
    try:
        import uvloop
    except ImportError:  # optional: the default loop works, only slower
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


def lower_thread_priority() -> None:
    """Run the calling thread at the lowest CPU priority (a thread pool's initializer): on a busy
    machine the event loop and the other threads come first, and the pool's work takes the CPU
    that is left over. Linux only; elsewhere, or where it is not allowed, nothing changes."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # Linux: per thread
    except (AttributeError, OSError):  # not Linux, or not allowed: the pool still works
        pass


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON response serialised with orjson."""
    return web.Response(
        body=orjson.dumps(body), status=status, content_type=JSON_CONTENT_TYPE, headers=headers
    )


STOP_WAIT_S = 5.0  # what stop_tasks waits for cancelled background tasks by default


async def stop_tasks(tasks: list[asyncio.Task[Any]], timeout_s: float = STOP_WAIT_S) -> None:
    """Cancel background ``tasks`` and wait for them, at most ``timeout_s``: a task that lost its
    cancellation (redis-py's asyncio client can return normally from a cancelled command,
    redis/redis-py#2028) is logged and left behind rather than holding a shutdown. ``wait`` neither
    raises the tasks' CancelledError nor swallows a cancellation of the caller's; the finished tasks'
    exceptions are retrieved (their loops log their own failures)."""
    for task in tasks:
        task.cancel()
    if not tasks:
        return
    done, stuck = await asyncio.wait(tasks, timeout=timeout_s)
    for task in done:
        if not task.cancelled():
            task.exception()
    for task in stuck:
        log.error("%s did not stop within %.0f s of its cancellation: left behind", task.get_name(), timeout_s)


class _ClientErrorLog(logging.LoggerAdapter):
    """aiohttp's server logger, but a client's malformed HTTP (aiohttp's ``HttpProcessingError``:
    a bad request line, a duplicate ``Content-Type``, an oversized header — answered 400 by
    aiohttp) is one DEBUG line, not an ERROR with a traceback: any client could otherwise fill
    the log with tracebacks. Failures of our own handlers keep their traceback."""

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            self.debug(f"{msg}: malformed HTTP: %s", *args, exc_info.message)
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)


def server_logger() -> logging.Logger:
    """The ``logger`` to give an aiohttp runner (``web.AppRunner(..., logger=server_logger())``)."""
    # aiohttp only calls .debug() and .exception() on it; an adapter has both.
    return cast(logging.Logger, _ClientErrorLog(logging.getLogger("aiohttp.server"), {}))


async def start_app(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start ``app`` on host:port (port 0: any free port); return the runner and the bound port."""
    # handler_cancellation: a client that goes away cancels its handler, so the gateway closes the
    # backend stream and an engine stops generating for nobody (aiohttp's default is off).
    runner = web.AppRunner(
        app, access_log=None, handle_signals=False, handler_cancellation=True, shutdown_timeout=5.0,
        logger=server_logger(),
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True, backlog=1024)
    await site.start()
    return runner, bound_port(runner)


def bound_port(runner: web.BaseRunner) -> int:
    """The port ``runner``'s first site listens on (the one the kernel picked for port 0)."""
    return int(runner.addresses[0][1])


async def serve_forever(start: Callable[[], Awaitable[Callable[[], Awaitable[None]]]]) -> None:
    """Run ``start()`` (which returns an async ``stop``) until SIGINT/SIGTERM, then stop."""
    stop_event = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop_event.set)
    stop = await start()
    try:
        await stop_event.wait()
    finally:
        await stop()
