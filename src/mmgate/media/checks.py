"""The blocking work a new image takes before it enters a tier: a data: URL's decode and SHA-256,
and a PNG's whole check (its chunks' CRCs) with its hash, in one open of the file. Pure functions,
run on the loader's event loop for a screenshot (``checked_inline``) and in its threads otherwise."""

from __future__ import annotations

import hashlib

import pybase64

from mmgate.media.dataurl import DataURL, decode_payload, forwarded_as
from mmgate.media.validate import PNG_SIGNATURE, ImageInfo, probe_image, validate_image

# data: payloads at least this big are decoded and hashed in the thread pool, not on the event loop.
INLINE_HASH_BYTES = 256 * 1024


def checked_inline(data: bytes) -> bool:
    """A PNG under ``INLINE_HASH_BYTES`` (a screenshot): its whole check (~0.2 ms; ~3 ms at
    ``check_structure``'s chunk limits) costs less on the loop than a trip to a thread and back
    (PERFORMANCE.md, "Agent capacity on real vLLM"). Other formats walk headers in Python: a thread."""
    return len(data) < INLINE_HASH_BYTES and data.startswith(PNG_SIGNATURE)


def decoded_digest(parsed: DataURL) -> tuple[bytes, str]:
    """A data: URL's bytes and their SHA-256 (its cache key and the image's digest)."""
    return (data := decode_payload(parsed)), hashlib.sha256(data).hexdigest()


def probe_and_check(
    data: bytes, allowed_formats: tuple[str, ...], max_pixels: int, digest: str | None, url: str | None
) -> tuple[ImageInfo, tuple[str, str] | None]:
    """The image's header; for a PNG (whose whole check is its chunks' CRCs, bounded by its bytes)
    that check and ``hash_encode`` too, in one open of the file: no decode process, no lane."""
    if data.startswith(PNG_SIGNATURE) and "PNG" in allowed_formats:
        info = validate_image(data, allowed_formats=("PNG",), max_pixels=max_pixels)
        return info, hash_encode(data, info.mime, digest, url)
    info = probe_image(data, allowed_formats=allowed_formats, max_pixels=max_pixels)
    return info, None


def hash_encode(data: bytes, mime: str, digest: str | None = None, url: str | None = None) -> tuple[str, str]:
    """The image's SHA-256 (``digest`` when already known) and the data URL that will be
    forwarded (``url``, the one ``data`` was decoded from, when it is that already): both release
    the GIL (hashlib, pybase64), so neither stalls the event loop."""
    sha = digest or hashlib.sha256(data).hexdigest()
    if url is not None and forwarded_as(url, mime, data):
        return sha, url
    return sha, f"data:{mime};base64," + pybase64.b64encode_as_string(data)
