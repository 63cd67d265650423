"""The access log: one line per request, JSON or logfmt, on the ``mmgate.access`` logger.

Fields (absent ones are ``-`` in logfmt, null in JSON): ``request_id``, ``method``, ``path``,
``status``, ``tenant``, ``session``, ``model``, ``backend``, the reuse counts (``sent`` whole,
``stripped`` and ``referenced`` as cache-only references, ``healed``), ``bytes_in``, ``bytes_out``,
``prompt_tokens``, ``completion_tokens``, ``ttfb_ms`` (until the response head went out) and
``total_ms``. Never a body, an image, a URL's query, a key or a header other than the session id.

Every string value is written with JSON's escapes wherever it is not printable (``json_text``), in
both formats: whatever a client sends (bytes that are not UTF-8, line or paragraph separators,
C0/C1 controls, DEL), a request is one line, and one line is one request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sys
from collections.abc import Callable
from typing import IO, Literal

import orjson

AccessLogFormat = Literal["logfmt", "json", "off"]
ACCESS_LOGGER = "mmgate.access"
# Longest client-chosen value (path, session) written; the rest is cut and marked.
MAX_VALUE_CHARS = 200


def clip(value: str | None) -> str | None:
    """``value`` cut to ``MAX_VALUE_CHARS`` (marked with an ellipsis)."""
    if value is None or len(value) <= MAX_VALUE_CHARS:
        return value
    return value[:MAX_VALUE_CHARS] + "…"


def json_text(value: str) -> str:
    """``value`` as a JSON string literal that is one printable line of UTF-8: every character
    ``str.isprintable`` refuses (C0/C1 controls, DEL, U+2028, U+2029, …) as its JSON escape, so a
    JSON reader gets the value back and no reader splits a line inside it; a byte that was not
    UTF-8 (kept by the header parsers as a lone surrogate, which JSON cannot hold) as the text
    ``\\xNN``."""
    if value.isprintable():
        return orjson.dumps(value).decode()
    return printable_json(orjson.dumps(_encodable(value)).decode())


def printable_json(encoded: str) -> str:
    """``encoded`` (JSON, from orjson) with the characters it writes raw but ``str.isprintable``
    refuses written as JSON escapes (they can only stand inside its strings)."""
    if encoded.isprintable():
        return encoded
    return "".join(c if c.isprintable() else _json_escape(ord(c)) for c in encoded)


def _json_escape(code: int) -> str:
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # a UTF-16 surrogate pair, as JSON writes a character past the first plane
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


# Lone surrogates: ``surrogateescape``'s stand-ins for bytes that were not UTF-8 (U+DC80 to U+DCFF),
# and any other a string could carry.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _encodable(value: str) -> str:
    return value if value.isprintable() else _SURROGATE.sub(_byte_text, value)


def _byte_text(match: re.Match[str]) -> str:
    code = ord(match[0])
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


# A value written bare: printable, no space, quote, ``=`` or backslash.
_BARE = re.compile(r'[^\s"=\\]+')


# One request's line, its values in the order of ``FIELD_NAMES``.
FIELD_NAMES = ("request_id", "method", "path", "status", "tenant", "session", "model", "backend", "sent", "stripped",
               "referenced", "healed", "bytes_in", "bytes_out", "prompt_tokens", "completion_tokens", "ttfb_ms",
               "total_ms")
Line = tuple[str, str, str | None, int, str | None, str | None, str | None, str | None, int, int, int, int, int, int,
             int | None, int | None, float | None, float]


def _text(value: str | None) -> str:
    """One string value of a logfmt line: bare when printable without space, quote, ``=`` or
    backslash; else ``json_text``."""
    if value is None:
        return "-"
    if _BARE.fullmatch(value) and value.isprintable():
        return value
    return json_text(value)


def logfmt_line(v: Line) -> str:
    """The logfmt line of the fields named ``FIELD_NAMES``, written in one pass: no dict, one call per
    string a client chose, the numbers formatted in place."""
    return (f"request_id={_text(v[0])} method={_text(v[1])} path={_text(v[2])} status={v[3]} tenant={_text(v[4])} "
            f"session={_text(v[5])} model={_text(v[6])} backend={_text(v[7])} sent={v[8]} stripped={v[9]} "
            f"referenced={v[10]} healed={v[11]} bytes_in={v[12]} bytes_out={v[13]} "
            f"prompt_tokens={'-' if v[14] is None else v[14]} completion_tokens={'-' if v[15] is None else v[15]} "
            f"ttfb_ms={'-' if v[16] is None else format(v[16], '.1f')} total_ms={v[17]:.1f}")


def json_values_line(values: Line) -> str:
    """The JSON object of the fields named ``FIELD_NAMES``, each string as ``json_text`` writes it."""
    return printable_json(orjson.dumps({name: _encodable(value) if isinstance(value, str) else value
                                        for name, value in zip(FIELD_NAMES, values, strict=True)}).decode())


def formatter(kind: AccessLogFormat) -> Callable[[Line], str] | None:
    """The line formatter of ``--access-log`` (None: off)."""
    return {"logfmt": logfmt_line, "json": json_values_line}.get(kind)


def access_logger() -> logging.Logger:
    """The ``mmgate.access`` logger. Lines are INFO records, so ``--log-level warning`` silences
    them, as uvicorn's access log."""
    return logging.getLogger(ACCESS_LOGGER)


class StderrLines:
    """Bare lines on stderr (no level or time prefix: a JSON line stays parseable), gathered and
    written together at most ``FLUSH_AFTER_S`` after the first of them: one write for every
    request that finished meanwhile, never a write per line on the request path, and one UTF-8
    encoding for them all. At most ``MAX_BUFFERED_BYTES`` characters wait; past it the lines are
    written at once."""

    MAX_BUFFERED_BYTES = 256 * 1024
    FLUSH_AFTER_S = 0.1

    def __init__(self, stream: IO[bytes] | None = None) -> None:
        self._stream = stream if stream is not None else sys.stderr.buffer
        self._lines: list[str] = []  # encoded together when written
        self._size = 0
        self._scheduled = False

    def __call__(self, line: str) -> None:
        self._lines.append(line)
        self._size += len(line) + 1  # characters: bytes for the ASCII lines almost all are
        if self._size > self.MAX_BUFFERED_BYTES:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_later(self.FLUSH_AFTER_S, self.flush)

    def flush(self) -> None:
        """Write what is gathered (also at shutdown)."""
        self._scheduled = False
        if not self._lines:
            return
        self._lines.append("")  # the last line's newline
        # ``backslashreplace``: a line that would not encode is written escaped, never lost.
        data, self._lines, self._size = "\n".join(self._lines).encode("utf-8", "backslashreplace"), [], 0
        with contextlib.suppress(OSError, ValueError):  # stderr closed or gone: the line is lost, not the request
            self._stream.write(data)
            self._stream.flush()


def line_writer(logger: logging.Logger) -> Callable[[str], None]:
    """Where the lines go: the logger's own handlers when the embedding program gave it some
    (tests, a program that routes logs itself), else ``StderrLines``."""
    if logger.handlers:
        return logger.info
    return StderrLines()
