"""A TCP proxy on loopback in front of a real backend that can be switched into a fault mode.

Modes: ``pass`` (forward both ways), ``refuse`` (nothing listens: connection refused), ``blackhole``
(a listener whose accept queue is full and never drained: the SYN is dropped, so connecting times
out), ``reset`` (accept, then RST before reading a byte), ``stall`` (accept and read the request,
never answer: a read timeout after the request was sent). Switching closes every connection opened
before, so a pooled keep-alive connection cannot hide the new mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from typing import Literal

Mode = Literal["pass", "refuse", "blackhole", "reset", "stall"]
_LINGER_RST = struct.pack("ii", 1, 0)


class FlakyProxy:
    """``url`` forwards to ``127.0.0.1:target_port`` until ``set_mode`` says otherwise."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.mode: Mode = "pass"
        self.accepted = 0  # connections accepted in a non-pass mode (stall, reset)
        self._server: asyncio.Server | None = None
        self._holes: list[socket.socket] = []
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> FlakyProxy:
        await self._listen()
        return self

    async def set_mode(self, mode: Mode) -> None:
        await self._close_all()
        self.mode = mode
        if mode == "refuse":
            return
        if mode == "blackhole":
            self._blackhole()
            return
        await self._listen()

    async def stop(self) -> None:
        await self._close_all()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port or 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def _blackhole(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(0)
        self._holes.append(listener)
        # Fill the accept queue (Linux keeps backlog + 1): later SYNs are dropped, never answered.
        for _ in range(3):
            filler = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", self.port))
            self._holes.append(filler)

    async def _close_all(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            await self._server.wait_closed()
            self._server = None
        self._writers.clear()
        for sock in self._holes:
            sock.close()
        self._holes.clear()
        await asyncio.sleep(0.05)  # let the clients' transports see their connections go

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            if self.mode == "reset":
                self.accepted += 1
                writer.transport.get_extra_info("socket").setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
                writer.transport.abort()
                return
            if self.mode == "stall":
                self.accepted += 1
                while await reader.read(65536):
                    pass
                return
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            self._writers.add(up_writer)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (ConnectionError, OSError):  # a peer went away: this connection is over
            pass
        finally:
            self._writers.discard(writer)
            writer.transport.abort()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.transport.abort()
