"""Request ids: the client's ``X-Request-Id`` kept when it is safe to log and to pass on, else a
new one. vLLM reads the same header (``X-Request-Id``) and builds its own request id from it
(``chatcmpl-<id>``), so one id follows a request from the client through the gateway into the
replica's logs."""

from __future__ import annotations

import os
import re

REQUEST_ID_HEADER = "X-Request-Id"
MAX_REQUEST_ID_LENGTH = 128
# Characters a log line, a header and vLLM's request id all carry unchanged.
_SAFE = re.compile(rf"[A-Za-z0-9._:+=@/-]{{1,{MAX_REQUEST_ID_LENGTH}}}")


TRACEPARENT_HEADER = "traceparent"
# W3C Trace Context, version 00: version-trace id-parent id-flags, lowercase hex; all-zero ids invalid.
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")


def valid_traceparent(value: str | None) -> str | None:
    """``value`` when it is a well-formed W3C ``traceparent`` (version ``ff`` excluded), else None."""
    if value is not None and len(value) == 55 and not value.startswith("ff") and _TRACEPARENT.fullmatch(value):
        return value
    return None


# Ids are cut from one ``os.urandom`` read of this many (one system call per 256 ids, not per id).
_IDS_PER_READ = 256
_pool: list[str] = []


def new_request_id() -> str:
    """A fresh id: 32 lowercase hex digits (128 bits from ``os.urandom``), as vLLM makes its own."""
    if not _pool:
        block = os.urandom(16 * _IDS_PER_READ).hex()
        _pool.extend(block[i:i + 32] for i in range(0, len(block), 32))
    return _pool.pop()


# A forked child must not hand out the ids its parent still holds.
os.register_at_fork(after_in_child=_pool.clear)


def request_id(incoming: str | None) -> str:
    """``incoming`` when it is 1..``MAX_REQUEST_ID_LENGTH`` safe characters, else a new id (an id
    with spaces, quotes or control characters would corrupt log lines downstream)."""
    if incoming and _SAFE.fullmatch(incoming):
        return incoming
    return new_request_id()
