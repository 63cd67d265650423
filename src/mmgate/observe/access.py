"""The access log: one line per request, JSON or logfmt, on the ``mmgate.access`` logger.

Fields (absent ones are ``-`` in logfmt, null in JSON): ``request_id``, ``method``, ``path``,
``status``, ``tenant``, ``session``, ``model``, ``backend``, the reuse counts (``sent`` whole,
``stripped`` and ``referenced`` as cache-only references, ``healed``), ``bytes_in``, ``bytes_out``,
``prompt_tokens``, ``completion_tokens``, ``ttfb_ms`` (until the response head went out) and
``total_ms``. Never a body, an image, a URL's query, a key or a header other than the session id.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Literal

import orjson

AccessLogFormat = Literal["logfmt", "json", "off"]
ACCESS_LOGGER = "mmgate.access"
Fields = dict[str, str | int | float | None]
# Longest client-chosen value (path, session) written; the rest is cut and marked.
MAX_VALUE_CHARS = 200


def clip(value: str | None) -> str | None:
    """``value`` cut to ``MAX_VALUE_CHARS`` (marked with an ellipsis)."""
    if value is None or len(value) <= MAX_VALUE_CHARS:
        return value
    return value[:MAX_VALUE_CHARS] + "…"


def logfmt(fields: Fields) -> str:
    """``key=value`` pairs; values with spaces, quotes, ``=`` or control characters quoted, with
    quotes, backslashes and control characters escaped (one line, whatever the client sent)."""
    parts = []
    for key, value in fields.items():
        if value is None:
            text = "-"
        elif isinstance(value, float):
            text = f"{value:.1f}"
        else:
            text = str(value)
            if not text or not text.isprintable() or any(c in text for c in ' "=\\'):
                text = orjson.dumps(text).decode()  # JSON string escaping: quotes, \\, \n, \u....
        parts.append(f"{key}={text}")
    return " ".join(parts)


def json_line(fields: Fields) -> str:
    return orjson.dumps(fields).decode()


def formatter(kind: AccessLogFormat) -> Callable[[Fields], str] | None:
    """The line formatter of ``--access-log`` (None: off)."""
    return {"logfmt": logfmt, "json": json_line}.get(kind)


def access_logger() -> logging.Logger:
    """The ``mmgate.access`` logger: bare lines on stderr (no level or time prefix: a JSON line
    stays parseable), unless the embedding program configured a handler for it. Lines are INFO
    records, so ``--log-level warning`` silences them, as uvicorn's access log."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    return logger
