"""The chat lane's reading of a request head (``mmgate.api.lane``): which requests it takes.

``parse_head`` parses one whole head with ``httptools`` and returns it when the lane takes the
request: ``POST /v1/chat/completions`` over HTTP/1.1, a ``Content-Length`` body of at most
``--max-body-bytes``, no ``Transfer-Encoding``, ``Content-Encoding``, ``Expect`` or ``Upgrade``, and
nothing aiohttp's own parser would refuse (its limits, duplicate singleton headers, no ``Host``, a
NUL in a value). Anything else is None: aiohttp gets the request, and gives a malformed one its
precise 400.
"""

from __future__ import annotations

from dataclasses import dataclass

import httptools
from aiohttp.http_parser import SINGLETON_HEADERS
from multidict import CIMultiDict

CHAT_URL = b"/v1/chat/completions"
REQUEST_LINE = b"POST " + CHAT_URL + b" HTTP/1.1\r\n"
# A head longer than this without its end goes to aiohttp, which refuses it with its own limits.
MAX_HEAD_BYTES = 64 * 1024
# Header names the lane looks at as they are parsed: those it leaves to aiohttp (a body it does
# not frame, an interim answer, a switch: "refused"), RFC 9110's singletons (which aiohttp's
# parser refuses twice) and the body's encoding.
_REFUSED = b"refused"
_WATCHED = {name.encode(): name.encode() for name in SINGLETON_HEADERS} | {
    b"content-encoding": b"content-encoding", b"transfer-encoding": _REFUSED, b"expect": _REFUSED,
    b"upgrade": _REFUSED}
_IDENTITY = ("", "identity")
# aiohttp's request parser limits (web.Server's defaults), checked so that what it would refuse
# goes to it: at most this many headers, each name and value together at most this long.
MAX_HEADERS = 128
MAX_FIELD_BYTES = 8190


@dataclass(slots=True)
class Head:
    """A chat request's head, as the lane keeps it."""

    headers: CIMultiDict[str]
    length: int  # of the body (Content-Length)
    keep_alive: bool


class _Collect:
    """httptools' callbacks: the headers of one head, and what of them the lane must know."""

    __slots__ = ("complete", "headers", "refused", "seen")

    def __init__(self) -> None:
        self.headers: CIMultiDict[str] = CIMultiDict()
        self.complete = False
        self.refused = False
        self.seen: list[bytes] = []

    def on_header(self, name: bytes, value: bytes) -> None:
        watched = _WATCHED.get(name.lower())
        if watched is not None:
            if watched is _REFUSED or watched in self.seen:  # a duplicate singleton: aiohttp's 400
                self.refused = True
            self.seen.append(watched)
        # As aiohttp decodes them: trailing blanks cut, a value that is not UTF-8 keeps its bytes
        # as surrogates (which the pipeline's header checks refuse by name).
        self.headers.add(name.decode("utf-8", "surrogateescape"),
                         value.rstrip(b" \t").decode("utf-8", "surrogateescape"))

    def on_headers_complete(self) -> None:
        self.complete = True


def parse_head(data: bytes, max_body_bytes: int) -> Head | None:
    """The head (``data``: one whole head, starting with ``REQUEST_LINE``) of a request the lane
    takes (the module docstring), or None: aiohttp's."""
    if b"\x00" in data or (len(data) > MAX_FIELD_BYTES and not _fields_fit(data)):
        return None
    collect = _Collect()
    parser = httptools.HttpRequestParser(collect)
    try:
        parser.feed_data(data)
    except httptools.HttpParserError:  # malformed: aiohttp answers it
        return None
    headers = collect.headers
    if not collect.complete or collect.refused or len(headers) > MAX_HEADERS or b"host" not in collect.seen:
        return None
    if b"content-encoding" in collect.seen and headers["Content-Encoding"].strip().lower() not in _IDENTITY:
        return None
    declared = headers.get("Content-Length", "0")
    if not declared.isdigit() or not declared.isascii():
        return None
    length = int(declared)
    if length > max_body_bytes:  # too large: aiohttp's route answers 413 (after a 401)
        return None
    return Head(headers, length, parser.should_keep_alive())


def _fields_fit(data: bytes) -> bool:
    """Every header line within aiohttp's field limit (a long head only)."""
    return all(len(line) <= MAX_FIELD_BYTES + 2 for line in data.split(b"\r\n"))
