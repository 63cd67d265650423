"""What the three programs (gateway, ``sim``, ``bench``) share on the wire: the OpenAI/vLLM error
shapes and vLLM's cache-miss answer (spelled here and nowhere else), vLLM's scheduler gauges (the sim
exports them, the gateway's router polls them: a backend's load as every gateway sees it), the
Qwen2-VL resize rule that says how many tokens an image costs (the sim processes images by it, the
gateway's router weighs them by it), and small asyncio/aiohttp helpers (serve an app, run until a signal, JSON responses)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import re
import signal
import socket
from collections.abc import Awaitable, Callable
from typing import Any, cast

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

log = logging.getLogger(__name__)

JSON_CONTENT_TYPE = "application/json"

# vLLM's answer (HTTP 400) to a cache-only image reference that is not in its processor cache.
CACHE_MISS_STATUS = 400
CACHE_MISS_MESSAGE = "Cache miss for image at index {index} but data is not provided."
CACHE_MISS_MARKER = "but data is not provided"
_MISS_INDEX = re.compile(r"image at index (\d+)")


def cache_miss_message(index: int) -> str:
    """vLLM's cache-miss message for the ``index``-th image of a request."""
    return CACHE_MISS_MESSAGE.format(index=index)


def error_message(body: Any, fallback: str) -> str:
    """The message of an OpenAI-style (or older vLLM-style) error body."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if isinstance(body.get("message"), str):
            return str(body["message"])
        if isinstance(body.get("detail"), str):
            return str(body["detail"])
    return fallback


def cache_miss_index(status: int, body: Any) -> int | None:
    """The image index a vLLM cache-miss answer names (-1 if unnamed), or None for other answers.

    Both of vLLM's error-body shapes are recognised: ``{"error": {"message": ...}}`` and the older
    ``{"object": "error", "message": ...}``.
    """
    if status != CACHE_MISS_STATUS or not isinstance(body, dict):
        return None
    err = body.get("error")
    message = err.get("message") if isinstance(err, dict) else body.get("message")
    if not isinstance(message, str) or "Cache miss" not in message or CACHE_MISS_MARKER not in message:
        return None
    found = _MISS_INDEX.search(message)
    return int(found.group(1)) if found else -1


# vLLM's scheduler gauges on /metrics (vllm/v1/metrics/loggers.py), one series per engine labelled
# model_name and engine: requests in the running batch, and requests queued for it.
RUNNING_GAUGE = "vllm:num_requests_running"
WAITING_GAUGE = "vllm:num_requests_waiting"
_LOAD_SERIES = re.compile(
    rb"^(?:vllm:num_requests_running|vllm:num_requests_waiting)(?:\{[^}\n]*\})?[ \t]+([0-9.eE+-]+|NaN)[ \t]*(?:[0-9]+)?$",
    re.MULTILINE,
)


def engine_load(metrics_text: bytes) -> int | None:
    """Running + waiting requests a Prometheus text page reports (summed over its engines), or
    None when it has neither gauge. ``vllm:num_requests_waiting_by_reason`` is not counted (it
    splits the waiting figure)."""
    found = False
    load = 0.0
    for match in _LOAD_SERIES.finditer(metrics_text):
        try:
            value = float(match.group(1))
        except ValueError:  # a malformed sample reads as absent, not as a load
            continue
        if value == value and value >= 0:  # NaN or negative: not a count
            load += value
            found = True
    return round(load) if found else None


def smart_resize(height: int, width: int, *, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's resize rule: both sides multiples of ``factor``, area within [min, max] pixels,
    aspect ratio kept as closely as possible. Returns ``(height, width)``; sides must be positive.

    Sides smaller than ``factor`` are rounded up to it instead of being rejected. The image then
    costs ``(height // factor) * (width // factor)`` tokens (one per merged patch).
    """
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def install_uvloop() -> bool:
    """Use uvloop's event loop when it is installed (about half the per-request CPU of asyncio's)."""
    try:
        import uvloop
    except ImportError:  # optional: the default loop works, only slower
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


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


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_EPHEMERAL_LOW = _ephemeral_low()
_handed_out: set[int] = set()
_ports = random.Random()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free a moment ago on ``host`` and not handed out before by this process (for
    tests, benchmarks and embedded engines), from below the ephemeral range: port 0 would give one
    inside it, where every outgoing connection draws its source port, so between the pick and the
    server's bind a connection could take it (a benchmark row died of "address already in use")."""
    low = 10000 if _EPHEMERAL_LOW > 11000 else 1024
    for _ in range(1000):
        port = _ports.randrange(low, _EPHEMERAL_LOW)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise OSError(f"no free TCP port on {host} in {low}..{_EPHEMERAL_LOW - 1}")


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
    bound = port
    sockets = getattr(site._server, "sockets", None)
    if sockets:
        bound = int(sockets[0].getsockname()[1])
    return runner, bound


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
