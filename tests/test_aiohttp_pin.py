"""aiohttp is pinned to one version (pyproject.toml) because mmgate reaches a few of its internals;
this checks that the installed version is the pinned one and that each internal is there, so an
upgrade that moves one fails here, by name, instead of in a stream's head or a pooled connection.

* ``api/forward.py``: ``StreamResponse._send_headers_immediately`` (a stream's head leaves with its
  first chunk).
* ``backends/session.py`` ``_CheckedRequest``: ``ClientRequest.send``, ``Connection.protocol`` and
  ``ResponseHandler.should_close`` (a pooled connection that received a stray reply is closed).
"""

from __future__ import annotations

import inspect
import re
import tomllib
from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.client_proto import ResponseHandler
from aiohttp.connector import Connection

ROOT = Path(__file__).resolve().parents[1]


def test_the_installed_aiohttp_is_the_pinned_one() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = [d for d in deps if re.match(r"aiohttp\b", d)]
    assert pins == [f"aiohttp=={aiohttp.__version__}"]


def test_a_stream_response_can_hold_its_head_for_the_first_write() -> None:
    assert web.StreamResponse._send_headers_immediately is True  # the attribute forward.py turns off


def test_the_client_internals_the_backend_client_reads_are_there() -> None:
    assert isinstance(inspect.getattr_static(Connection, "protocol"), property)
    assert isinstance(inspect.getattr_static(ResponseHandler, "should_close"), property)
    assert list(inspect.signature(aiohttp.ClientRequest.send).parameters) == ["self", "conn"]
    params = inspect.signature(aiohttp.ClientSession.__init__).parameters
    for name in ("request_class", "max_line_size", "max_field_size", "max_headers"):
        assert name in params, name
