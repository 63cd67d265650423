"""The HTTP edge: what a client can hold of the gateway before it has been authenticated.

* ``read_body``: the body cap checked against Content-Length before a byte is read (413), chunked
  bodies counted as they arrive (413 at the first byte past the cap), and one deadline for the
  whole body (408), so a slow sender holds a connection for ``body_timeout_s`` at most.
* Compressed bodies: aiohttp's own inflation is off (it would run on the event loop, and count
  against the cap only once inflated: 255 KB of gzip became 250 MiB). A body with a
  ``Content-Encoding`` is refused (415) before it is read, unless ``max_inflation_ratio`` allows
  gzip/deflate: then the compressed bytes count against the cap as they arrive, and they are
  inflated in a thread, to at most ``max_bytes`` and ``ratio`` x their size (413 past either).
* Header deadline: aiohttp's keep-alive timer also runs from the moment a connection opens until
  its first request's headers are complete (and again between requests), and closes the connection
  if they are not; ``header_timeout_s`` is that timer.
* ``raise_fd_limit``: the process's soft open-files limit raised to its hard limit.

The edge holds no connection cap of its own: a cap on aiohttp's public API can only pause
accepting, and one that displaces slow clients must read aiohttp's private connection table.
Where slow-client floods are a threat, a maintained proxy in front bounds them
(``deploy/nginx/mmgate.conf``, docs/DEPLOY.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import resource
import zlib
from concurrent.futures import Executor

from aiohttp import web

from mmgate.api.inflight_bodies import BODIES_KEY, InflightBodies
from mmgate.errors import BodyTimeoutError, BodyTooLargeError, InvalidRequestError, UnsupportedEncodingError

log = logging.getLogger(__name__)
# The open-files soft limit wanted (client and backend connections, origins, Redis, logs).
FD_LIMIT = 1 << 20
_JOIN_IN_THREAD_BYTES = 1 << 20


# zlib's wbits for each Content-Encoding accepted: gzip framing, and deflate as zlib framing or raw
# (HTTP's "deflate" is zlib framing; some clients send raw deflate: 47 detects gzip or zlib).
_WBITS = {"gzip": 31, "x-gzip": 31, "deflate": 47}
# Members a gzip body may be made of: a writer makes one, a few concatenated files make a few; a
# body of many empty ones costs a zlib object each and inflates to nothing.
MAX_GZIP_MEMBERS = 64


def body_encoding(request: web.Request, max_inflation_ratio: int) -> str | None:
    """The body's Content-Encoding to inflate (None: none), or 415 when it is not accepted."""
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if not encoding or encoding == "identity":
        return None
    if max_inflation_ratio <= 0:
        raise UnsupportedEncodingError(
            f"request bodies with Content-Encoding: {encoding[:32]} are not accepted: send the body "
            "uncompressed", param="Content-Encoding")
    if encoding not in _WBITS:
        raise UnsupportedEncodingError(
            f"Content-Encoding: {encoding[:32]} is not supported (gzip or deflate)", param="Content-Encoding")
    return encoding


def inflate(raw: bytes, encoding: str, *, max_bytes: int, ratio: int) -> bytes:
    """``raw`` inflated, to at most ``min(max_bytes, ratio * len(raw))`` bytes (blocking: call it in
    a thread). Every member of a gzip body (RFC 1952: a body may be several); 413 past the limit,
    400 for data that is not what its encoding says, truncated or followed by other bytes."""
    limit = min(max_bytes, ratio * max(len(raw), 1))
    gzip = _WBITS[encoding] == _WBITS["gzip"]
    pieces: list[bytes] = []
    size = 0
    rest = raw
    while True:
        inflater = zlib.decompressobj(_WBITS[encoding])
        try:
            piece = inflater.decompress(rest, limit + 1 - size)
        except zlib.error as exc:
            raise InvalidRequestError(f"request body is not valid {encoding} data: {exc}",
                                      param="Content-Encoding") from exc
        size += len(piece)
        pieces.append(piece)
        if size > limit or inflater.unconsumed_tail:
            raise BodyTooLargeError(
                f"request body inflates past {limit} bytes ({len(raw)} compressed; the limits are "
                f"--max-body-bytes and --max-inflation-ratio {ratio})")
        if not inflater.eof:
            raise InvalidRequestError(f"request body is truncated {encoding} data", param="Content-Encoding")
        rest = inflater.unused_data
        if not rest:
            return pieces[0] if len(pieces) == 1 else b"".join(pieces)
        if not gzip:
            raise InvalidRequestError(f"request body has {len(rest)} bytes after its {encoding} data",
                                      param="Content-Encoding")
        if len(pieces) == MAX_GZIP_MEMBERS:
            raise InvalidRequestError(f"request body has more than {MAX_GZIP_MEMBERS} gzip members",
                                      param="Content-Encoding")


async def read_body(
    request: web.Request, *, max_bytes: int, timeout_s: float, max_inflation_ratio: int = 0,
    inflate_pool: Executor | None = None,
) -> bytes:
    """The request body, at most ``max_bytes``, within ``timeout_s``, inflated when compressed
    (see the module docstring) in ``inflate_pool`` (the gateway's low-priority threads: inflating
    is the one CPU cost a client sets by what it sends, so it takes what the rest leaves)."""
    encoding = body_encoding(request, max_inflation_ratio)
    raw = await _read_raw(request, max_bytes=max_bytes, timeout_s=timeout_s)
    if encoding is None:
        return raw
    work = functools.partial(inflate, raw, encoding, max_bytes=max_bytes, ratio=max_inflation_ratio)
    return await asyncio.get_running_loop().run_in_executor(inflate_pool, work)


_NO_WAIT = contextlib.nullcontext()


async def _read_raw(request: web.Request, *, max_bytes: int, timeout_s: float) -> bytes:
    declared = request.content_length
    if declared is not None and declared > max_bytes:
        raise BodyTooLargeError(f"request body of {declared} bytes is over the {max_bytes}-byte limit")
    # Counted as it arrives, not as declared: a client that announces a large body and sends it
    # slowly holds no more than it has sent.
    counted: InflightBodies | None = request.config_dict.get(BODIES_KEY)
    # readchunk hands over one buffered chunk at a time (readany joins what is buffered, on the
    # loop); the chunks of a large body are joined in a thread, where bytes.join drops the GIL
    # (on the loop, a 100 MB body's join held every other request ~100 ms).
    chunks: list[bytes] = []
    received = 0
    content = request.content
    # A body already whole in the buffer (a small one comes in the head's packet) has nothing to
    # wait for: taken in one call, no deadline timer to arm and cancel.
    whole = content.is_eof()
    try:
        if whole and content.total_bytes < _JOIN_IN_THREAD_BYTES:
            raw = content.read_nowait()
            if len(raw) > max_bytes:
                raise BodyTooLargeError(f"request body is over the {max_bytes}-byte limit")
            if counted is not None:
                counted.reserve(request, len(raw))
            return raw
        async with _NO_WAIT if whole else asyncio.timeout(timeout_s):
            while True:
                chunk, _ = await content.readchunk()
                if not chunk:
                    break
                received += len(chunk)
                if received > max_bytes:
                    raise BodyTooLargeError(f"request body is over the {max_bytes}-byte limit")
                if counted is not None:
                    counted.reserve(request, len(chunk))
                chunks.append(chunk)
    except TimeoutError as exc:
        raise BodyTimeoutError(
            f"request body not received within {timeout_s:g}s ({received} bytes arrived)"
        ) from exc
    except web.RequestPayloadError as exc:
        # aiohttp could not decode the body (a Content-Encoding that is not what it says, broken
        # chunked framing): the client's fault, a 400 — not aiohttp's plain-text 500.
        reason = getattr(exc.__cause__, "message", None) or str(exc) or "malformed body"
        raise InvalidRequestError(f"request body could not be read: {str(reason).strip()}") from exc
    if received >= _JOIN_IN_THREAD_BYTES:
        return await asyncio.to_thread(b"".join, chunks)
    return b"".join(chunks)


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (at most ``FD_LIMIT``), so that a flood of
    connections meets aiohttp's header deadline rather than a failing ``accept()``, which would
    stall every client; return the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = FD_LIMIT if hard == resource.RLIM_INFINITY else min(FD_LIMIT, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:  # not allowed here: keep the limit we have
            log.warning("cannot raise the open-files limit to %d: %s", target, exc)
    return soft
