"""The gateway's side of the front door (``mmgate.frontdoor``): an aiohttp site whose connections
arrive from a process of their own, each once its request head is complete.

``FrontDoorSite.start`` binds the listening socket, starts ``python -m mmgate.frontdoor`` with it
and one end of a SOCK_SEQPACKET pair, and reads that pair on the event loop: each message carries
one client connection's descriptor and the bytes the front door read from it, which are handed to
aiohttp (through ``ConnectionGuard``, which still caps the connections past their first head) as if
they had just arrived. Connections before their first head — every slow or silent client — are
held, capped and timed out over there, and never cost this event loop a turn. The front door's
counts come as messages too and go to ``mmgate_edge_connections_total``. If the front door dies,
it is started again (the listening socket stays open here, so clients meanwhile wait in its
backlog); ``stop`` ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from aiohttp import web

from mmgate.api.edge import ConnectionGuard
from mmgate.frontdoor import STATS

log = logging.getLogger(__name__)
_MAX_MESSAGE = 65536 + 65536 + 64  # a head of at most --max-head-bytes plus one read past it
_RESTART_AFTER_S = 0.2
# Front-door counts that are mmgate_edge_connections_total events ("busy": answered 503, the
# gateway did not take the connection in time).
_EVENTS = ("displaced", "timed_out", "busy")


def front_door_supported() -> bool:
    """SOCK_SEQPACKET pairs and descriptor passing (Linux; not macOS or Windows)."""
    try:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    except (AttributeError, OSError):
        return False
    a.close()
    b.close()
    return hasattr(socket, "send_fds")


class _Primed(asyncio.Protocol):
    """Gives aiohttp's handler a connection and, at once, the bytes the front door already read;
    then steps aside (``set_protocol``), so later reads go to the handler directly."""

    def __init__(self, inner: asyncio.Protocol, prefix: bytes) -> None:
        self.inner = inner
        self.prefix = prefix

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.inner.connection_made(transport)
        transport.set_protocol(self.inner)
        prefix, self.prefix = self.prefix, b""
        if prefix and not transport.is_closing():
            self.inner.data_received(prefix)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


def _bind(host: str, port: int, backlog: int) -> socket.socket:
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    sock = socket.create_server((host, port), family=family, backlog=backlog, reuse_port=False)
    sock.set_inheritable(True)
    return sock


class FrontDoorSite(web.BaseSite):
    """An aiohttp site fed by the front door process (see the module docstring)."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, max_connections: int,
                 header_timeout_s: float, on_event: Callable[[str, int], None] | None = None,
                 backlog: int = 1024) -> None:
        super().__init__(runner, backlog=backlog)
        self._app_runner = runner
        self._listen_backlog = backlog
        self._host = host
        self._port = port
        self._max_connections = max_connections
        self._header_timeout_s = header_timeout_s
        self._on_event = on_event or (lambda _event, _count: None)
        self.guard: ConnectionGuard | None = None
        self._listen: socket.socket | None = None
        self._bound_port = port
        self._ctrl: socket.socket | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._stopping = False
        self._adopting: set[asyncio.Task[Any]] = set()
        self._seen: dict[str, int] = {}
        self.stats: dict[str, int] = {}

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self.bound_port}"

    @property
    def bound_port(self) -> int:
        return self._bound_port

    async def start(self) -> None:
        await super().start()  # registers the site with its runner
        server = self._app_runner.server
        assert server is not None
        self.guard = ConnectionGuard(server, self._max_connections, lambda event: self._on_event(event, 1))
        self._listen = _bind(self._host, self._port, self._listen_backlog)
        self._bound_port = int(self._listen.getsockname()[1])
        self._spawn()

    def _spawn(self) -> None:
        assert self._listen is not None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listen_fd, ctrl_fd = self._listen.fileno(), theirs.fileno()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mmgate.frontdoor", "--listen-fd", str(listen_fd), "--ctrl-fd", str(ctrl_fd),
             "--max-connections", str(self._max_connections), "--header-timeout", str(self._header_timeout_s)],
            pass_fds=(listen_fd, ctrl_fd), stdin=subprocess.DEVNULL)
        theirs.close()
        ours.setblocking(False)
        self._ctrl = ours
        self._seen = {}
        asyncio.get_running_loop().add_reader(ours.fileno(), self._on_ctrl)

    def _on_ctrl(self) -> None:
        ctrl = self._ctrl
        assert ctrl is not None
        while True:
            try:
                data, fds, _flags, _addr = socket.recv_fds(ctrl, _MAX_MESSAGE, 4)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, fds = b"", []
            if not data and not fds:
                self._lost()
                return
            if fds:
                self._adopt(fds[0], data)
                for extra in fds[1:]:
                    socket.close(extra)
            elif data.startswith(STATS):
                self._count(json.loads(data[len(STATS):]))

    def _adopt(self, fd: int, prefix: bytes) -> None:
        sock = socket.socket(fileno=fd)
        if self._stopping or self.guard is None:
            sock.close()
            return
        sock.setblocking(False)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        guard = self.guard
        loop = asyncio.get_running_loop()
        task = loop.create_task(loop.connect_accepted_socket(
            lambda: _Primed(guard(), prefix), sock))
        self._adopting.add(task)
        task.add_done_callback(self._adopted)

    def _adopted(self, task: asyncio.Task[Any]) -> None:
        self._adopting.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("a connection from the front door could not be adopted: %s", task.exception())

    def _count(self, counts: dict[str, int]) -> None:
        self.stats = counts
        for event in _EVENTS:
            delta = counts.get(event, 0) - self._seen.get(event, 0)
            if delta > 0:
                self._on_event(event, delta)
        self._seen = counts

    def _lost(self) -> None:
        """The front door is gone: start another unless the gateway is stopping."""
        self._close_ctrl()
        if self.process is not None:
            code = self.process.poll()
            if not self._stopping:
                log.error("the front door process ended (exit status %s): starting it again", code)
        if not self._stopping:
            asyncio.get_running_loop().call_later(_RESTART_AFTER_S, self._restart)

    def _restart(self) -> None:
        if self._stopping:
            return
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=5)
        self._spawn()

    def _close_ctrl(self) -> None:
        if self._ctrl is not None:
            asyncio.get_running_loop().remove_reader(self._ctrl.fileno())
            with contextlib.suppress(OSError):
                self._ctrl.send(b"stop")
            self._ctrl.close()
            self._ctrl = None

    async def stop(self) -> None:
        """No new connections: the front door ends (with the connections it holds), the listening
        socket closes."""
        self._stopping = True
        self._close_ctrl()
        if self.process is not None:
            try:
                await asyncio.to_thread(self.process.wait, 5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                await asyncio.to_thread(self.process.wait, 5)
        if self._listen is not None:
            self._listen.close()
        await super().stop()
