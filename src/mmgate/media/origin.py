"""Fetching image bytes from an origin: http(s) over one shared aiohttp session, or file:.

The only module that talks to aiohttp for media: its exceptions are translated here
(``_translate``) into ``OriginError`` / ``OriginTimeoutError`` / ``ForbiddenURLError`` /
``ImageTooLargeError``, with a message naming the (redacted) URL and what the origin did.

* Redirects are followed by hand (``allow_redirects=False``), at most ``max_redirects`` hops,
  each hop re-checked by the URL policy (and its addresses by the resolver).
* Bodies are streamed and abandoned — the connection closed, not returned to the pool — as soon
  as they pass ``max_image_bytes``; a ``Content-Length`` over the cap is refused before reading.
* Timeouts: ``connect_timeout_s`` per DNS lookup and per socket connect, ``read_timeout_s`` per
  socket read (headers and every body chunk), ``total_timeout_s`` for the whole fetch, redirects
  included.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable
from http import HTTPStatus

import aiohttp
from yarl import URL

from mmgate.config import MediaSettings
from mmgate.errors import (
    ForbiddenURLError,
    ImageTooLargeError,
    MediaError,
    OriginError,
    OriginRefusedError,
    OriginTimeoutError,
    origin_status_error,
)
from mmgate.media.dns import Lookup, PolicyResolver
from mmgate.media.url_policy import UrlPolicy, redact_url

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CHUNK = 64 * 1024
_HEADERS = {
    "User-Agent": "mmgate-media/0.1",
    "Accept": "image/*",
    # Identity only: a compressed body would be inflated past the byte cap before we count it.
    "Accept-Encoding": "identity",
}


class OriginFetcher:
    """Fetches image bytes; owns one aiohttp session and connector (close it with ``close``).

    ``on_bytes`` is called with each received chunk's size (the origin-bytes metric).
    ``lookup`` replaces DNS (tests script a rebinding DNS with it).
    """

    def __init__(
        self,
        media: MediaSettings,
        policy: UrlPolicy,
        *,
        on_bytes: Callable[[int], None] | None = None,
        lookup: Lookup | None = None,
    ) -> None:
        self._media = media
        self._policy = policy
        self._on_bytes = on_bytes
        self._lookup = lookup
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        self._timeout = aiohttp.ClientTimeout(
            total=None,  # the whole-fetch deadline is ours (it spans redirects)
            connect=None,
            sock_connect=media.connect_timeout_s,
            sock_read=media.read_timeout_s,
        )

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            resolver = PolicyResolver(
                self._policy, timeout_s=self._media.connect_timeout_s, lookup=self._lookup
            )
            connector = aiohttp.TCPConnector(
                resolver=resolver, limit=256, limit_per_host=32, ttl_dns_cache=10
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=self._timeout,
                headers=_HEADERS,
                trust_env=False,  # an environment proxy would bypass the policy and the pinning
                cookie_jar=aiohttp.DummyCookieJar(),  # nothing carried between fetches
                auto_decompress=False,
            )
        return self._session

    async def close(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def fetch(self, url: str) -> bytes:
        """The body of ``url`` (http, https or file:), at most ``max_image_bytes``."""
        if self._closed:
            raise OriginError("the media loader is shutting down; retry the request")
        if url[:5].lower() == "file:":
            data = await asyncio.to_thread(read_local_file, self._policy, url, self._media.max_image_bytes)
            if self._on_bytes is not None:
                self._on_bytes(len(data))
            return data
        total = self._media.total_timeout_s
        try:
            async with asyncio.timeout(total):
                return await self._fetch_http(url)
        except TimeoutError as exc:
            # Ours (total) or aiohttp's connect/read timeouts, which subclass TimeoutError.
            raise OriginTimeoutError(_timeout_message(url, exc, self._media)) from exc

    async def _fetch_http(self, url: str) -> bytes:
        checked = self._policy.check_url(url)
        for _hop in range(self._media.max_redirects + 1):
            target = checked.url
            try:
                async with self._get_session().get(
                    target, allow_redirects=False, max_line_size=16384, max_field_size=16384
                ) as resp:
                    if resp.status in _REDIRECTS:
                        location = resp.headers.get("Location")
                        if not location:
                            raise OriginError(
                                f"{redact_url(target)} answered {resp.status} without a Location"
                            )
                        next_url = _join(target, location)
                        if next_url.scheme not in ("http", "https"):
                            raise ForbiddenURLError(
                                f"{redact_url(target)} redirected to a {next_url.scheme!r} URL; "
                                "only http(s) redirects are followed"
                            )
                        try:
                            checked = self._policy.check_url(next_url)
                        except ForbiddenURLError as exc:
                            raise ForbiddenURLError(
                                f"{redact_url(target)} redirected to {redact_url(next_url)}, "
                                f"which is refused: {exc.message}"
                            ) from exc
                        continue
                    if resp.status >= 400:
                        raise origin_status_error(resp.status, f"{redact_url(target)} answered {_status(resp.status)}")
                    if resp.status != 200:
                        raise OriginError(
                            f"{redact_url(target)} answered {_status(resp.status)}, expected 200"
                        )
                    return await self._read_body(resp, target)
            except (MediaError, asyncio.CancelledError, TimeoutError):
                raise
            except aiohttp.ClientError as exc:
                raise _translate(exc, target) from exc
            except OSError as exc:  # socket errors aiohttp did not wrap
                raise OriginError(f"could not fetch {redact_url(target)}: {exc}") from exc
        raise OriginError(
            f"{redact_url(url)}: too many redirects (more than {self._media.max_redirects})"
        )

    async def _read_body(self, resp: aiohttp.ClientResponse, target: URL) -> bytes:
        cap = self._media.max_image_bytes
        declared = resp.content_length
        if declared is not None and declared > cap:
            resp.close()
            raise ImageTooLargeError(
                f"{redact_url(target)} is {declared} bytes, over the {cap}-byte image limit"
            )
        body = bytearray()
        async for chunk in resp.content.iter_chunked(_CHUNK):
            body += chunk
            if self._on_bytes is not None:
                self._on_bytes(len(chunk))
            if len(body) > cap:
                resp.close()  # drop the connection: do not drain the rest of an oversize body
                raise ImageTooLargeError(
                    f"{redact_url(target)} is over the {cap}-byte image limit (download stopped)"
                )
        return bytes(body)


def read_local_file(policy: UrlPolicy, url: str, max_bytes: int) -> bytes:
    """Read a ``file:`` URL inside allowed_local_media_path (blocking: run it in a thread)."""
    real = policy.check_file_url(url)
    shown = redact_url(url)
    try:
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError as exc:
        raise OriginRefusedError(f"{shown}: no such file") from exc
    except OSError as exc:
        raise OriginRefusedError(f"{shown}: cannot open ({exc.strerror})") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OriginRefusedError(f"{shown} is not a regular file")
        # The path may have been swapped after the check: judge the file actually opened.
        proc = f"/proc/self/fd/{fd}"
        if os.path.exists(proc) and not policy.is_inside_local_root(os.path.realpath(proc)):
            raise ForbiddenURLError(f"{shown} is outside the allowed local media directory")
        if info.st_size > max_bytes:
            raise ImageTooLargeError(
                f"{shown} is {info.st_size} bytes, over the {max_bytes}-byte image limit"
            )
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:  # a read error (EIO …) is the origin's failure, not ours
        raise OriginError(f"{shown}: cannot read ({exc.strerror or exc})") from exc
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise ImageTooLargeError(f"{shown} is over the {max_bytes}-byte image limit")
    return data


def _join(base: URL, location: str) -> URL:
    try:
        return base.join(URL(location))
    except ValueError as exc:
        raise OriginError(f"{redact_url(base)} redirected to a malformed URL") from exc


def _status(code: int) -> str:
    try:
        return f"HTTP {code} {HTTPStatus(code).phrase}"
    except ValueError:
        return f"HTTP {code}"


def _translate(exc: aiohttp.ClientError, target: URL) -> MediaError:
    """The one boundary where aiohttp's exceptions become ours."""
    shown = redact_url(target)
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return OriginError(f"could not resolve the host of {shown}")
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return OriginError(f"TLS certificate of {shown} is not valid")
    if isinstance(exc, aiohttp.ClientSSLError):
        return OriginError(f"TLS handshake with {shown} failed")
    if isinstance(exc, aiohttp.ClientConnectorError):
        why = exc.strerror or "failed"
        return OriginError(f"could not connect to {shown}: {why}")
    if isinstance(exc, aiohttp.InvalidURL):
        return ForbiddenURLError(f"invalid image URL {shown}")
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return OriginError(f"{shown}: the origin closed the connection before the image was complete")
    if isinstance(exc, aiohttp.ClientResponseError):
        return OriginError(f"{shown}: invalid HTTP response ({exc.message})")
    return OriginError(f"could not fetch {shown}: {type(exc).__name__}")


def _timeout_message(url: str, exc: BaseException, media: MediaSettings) -> str:
    shown = redact_url(url)
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return f"timed out connecting to {shown} (limit {media.connect_timeout_s:g}s)"
    if isinstance(exc, aiohttp.SocketTimeoutError):
        return f"{shown} sent nothing for {media.read_timeout_s:g}s"
    return f"fetching {shown} took longer than {media.total_timeout_s:g}s"

