"""aiohttp is pinned to one version (pyproject.toml) because mmgate reaches a few of its internals;
this checks that the installed version is the pinned one and that each internal is there, so an
upgrade that moves one fails here, by name, instead of in a connection cap or a pooled connection.

* ``api/edge.py`` ``ConnectionGuard``: ``web.Server._connections`` (a dict in connection order:
  its size without the list copy ``Server.connections`` makes) and each ``RequestHandler``'s
  ``_force_close``, ``_request_in_progress``, ``_messages``, ``_request_count``, ``_waiter`` (which
  connection is idle and may be displaced), each checked here to mean what the cap takes it to mean
  over a real connection's life; ``serving.py``: a site's ``_server``.
* ``api/forward.py``: ``StreamResponse._send_headers_immediately`` (a stream's head leaves with its
  first chunk).
* ``backends/session.py`` ``_CheckedRequest``: ``ClientRequest.send``, ``Connection.protocol`` and
  ``ResponseHandler.should_close`` (a pooled connection that received a stray reply is closed).
"""

from __future__ import annotations

import asyncio
import inspect
import re
import tomllib
from collections.abc import Callable
from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.client_proto import ResponseHandler
from aiohttp.connector import Connection
from aiohttp.web_protocol import RequestHandler

ROOT = Path(__file__).resolve().parents[1]


def test_the_installed_aiohttp_is_the_pinned_one() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = [d for d in deps if re.match(r"aiohttp\b", d)]
    assert pins == [f"aiohttp=={aiohttp.__version__}"]


async def test_the_server_internals_the_connection_cap_reads_mean_what_it_takes_them_to() -> None:
    """A connection's life on a real server: before its first head, inside a request, idle on
    keep-alive, force-closed, read through exactly the fields ``api/edge.py`` reads."""
    inside = asyncio.Event()
    release = asyncio.Event()

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        inside.set()
        await release.wait()
        return web.Response(text="ok")

    server = web.Server(handler)
    runner = web.ServerRunner(server)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    assert site._server is not None and site._server.sockets  # serving.py reads the bound port here
    port = site._server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")  # a head not yet complete
        await writer.drain()
        await until(lambda: len(server._connections) == 1)
        assert isinstance(server._connections, dict)
        [conn] = server._connections
        assert isinstance(conn, RequestHandler)
        assert (conn._request_count, conn._request_in_progress, bool(conn._messages), conn._force_close) == \
            (0, False, False, False)
        writer.write(b"\r\n")
        await asyncio.wait_for(inside.wait(), 5)
        assert conn._request_count == 1 and conn._request_in_progress and conn._waiter is None
        release.set()
        await asyncio.wait_for(reader.readuntil(b"ok"), 5)
        await until(lambda: conn._waiter is not None)  # idle on keep-alive, waiting for the next head
        assert not conn._request_in_progress and not conn._messages
        conn.force_close()
        assert conn._force_close
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
    finally:
        await runner.cleanup()


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


def test_a_stream_response_can_hold_its_head_for_the_first_write() -> None:
    assert web.StreamResponse._send_headers_immediately is True  # the attribute forward.py turns off


def test_the_client_internals_the_backend_client_reads_are_there() -> None:
    assert isinstance(inspect.getattr_static(Connection, "protocol"), property)
    assert isinstance(inspect.getattr_static(ResponseHandler, "should_close"), property)
    assert list(inspect.signature(aiohttp.ClientRequest.send).parameters) == ["self", "conn"]
    params = inspect.signature(aiohttp.ClientSession.__init__).parameters
    for name in ("request_class", "max_line_size", "max_field_size", "max_headers"):
        assert name in params, name
