"""Image bytes for the sim: ``data:`` URLs and http(s) fetches under a byte cap and a timeout.

aiohttp and base64 errors are translated here into mmgate's error tree. The sim applies no URL
policy (it is a test engine, bound to loopback by default): do not expose it to untrusted clients.
"""

from __future__ import annotations

import asyncio
import binascii
from urllib.parse import unquote_to_bytes, urlsplit

import aiohttp
import pybase64

from mmgate.sim.errors import ImageTooLargeError, InvalidRequestError, OriginError, OriginTimeoutError

FETCH_CHUNK = 64 * 1024


def data_url_payload(url: str, max_bytes: int) -> bytes:
    """Decode a ``data:[<mime>][;base64],<payload>`` URL, refusing payloads over ``max_bytes``."""
    header, sep, payload = url.partition(",")
    if not sep:
        raise InvalidRequestError("Invalid data URL: missing ','.")
    if ";base64" in header.lower():
        if (len(payload) * 3) // 4 > max_bytes + 2:
            raise ImageTooLargeError(f"Image data exceeds the limit of {max_bytes} bytes.")
        try:
            data = pybase64.b64decode(payload, validate=False)
        except (binascii.Error, ValueError) as exc:
            raise InvalidRequestError(f"Invalid base64 image data: {exc}.") from exc
    else:
        data = unquote_to_bytes(payload)
    if len(data) > max_bytes:
        raise ImageTooLargeError(f"Image data exceeds the limit of {max_bytes} bytes.")
    return data


def check_remote_url(url: str) -> None:
    scheme = urlsplit(url).scheme.lower()
    if scheme not in ("http", "https"):
        raise InvalidRequestError(
            f"Unsupported image URL scheme {scheme!r}: use a data: or http(s) URL."
        )


async def fetch_image(session: aiohttp.ClientSession, url: str, *, max_bytes: int,
                      timeout_s: float) -> bytes:
    """GET ``url`` and return the body; 4xx errors for every way the fetch can fail."""
    check_remote_url(url)
    try:
        async with asyncio.timeout(timeout_s):
            async with session.get(url, allow_redirects=True, max_redirects=3) as resp:
                if resp.status >= 400:
                    raise OriginError(f"Failed to fetch image from {url}: HTTP {resp.status}.")
                if resp.content_length is not None and resp.content_length > max_bytes:
                    raise ImageTooLargeError(f"Image at {url} exceeds the limit of {max_bytes} bytes.")
                chunks: list[bytes] = []
                total = 0
                async for chunk in resp.content.iter_chunked(FETCH_CHUNK):
                    total += len(chunk)
                    if total > max_bytes:
                        raise ImageTooLargeError(
                            f"Image at {url} exceeds the limit of {max_bytes} bytes."
                        )
                    chunks.append(chunk)
                return b"".join(chunks)
    except TimeoutError as exc:
        raise OriginTimeoutError(f"Timed out fetching image from {url} after {timeout_s:g}s.") from exc
    except (aiohttp.ClientError, ValueError) as exc:  # ValueError: a URL aiohttp cannot parse
        raise OriginError(f"Failed to fetch image from {url}: {exc.__class__.__name__}: {exc}.") from exc
