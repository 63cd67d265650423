"""``data:`` image URLs: ``data:<image mime>[;param]*;base64,<payload>``. Pure functions.

Only base64 payloads of ``image/*`` types are accepted; base64 is decoded strictly (no
whitespace, correct padding). The decoded size is computed from the payload length and checked
against the byte limit before anything is decoded.
"""

from __future__ import annotations

import binascii
import re
from dataclasses import dataclass

import pybase64

from mmgate.errors import ImageTooLargeError, UnsupportedImageError

_MIME = re.compile(r"image/[a-z0-9][a-z0-9.+-]{0,126}")
_MAX_HEADER = 256


@dataclass(frozen=True, slots=True)
class DataURL:
    """A parsed, size-checked ``data:`` URL; the payload is still base64 text."""

    mime: str
    payload: str

    @property
    def num_bytes(self) -> int:
        return decoded_size(self.payload)


def is_data_url(url: str) -> bool:
    return url[:5].lower() == "data:"


def decoded_size(payload: str) -> int:
    """Bytes that a padded base64 ``payload`` decodes to (no decoding)."""
    pad = 2 if payload.endswith("==") else 1 if payload.endswith("=") else 0
    return len(payload) // 4 * 3 - pad


def parse_data_url(url: str, *, max_bytes: int) -> DataURL:
    """Split and check a ``data:`` URL; raises UnsupportedImageError / ImageTooLargeError."""
    comma = url.find(",", 0, _MAX_HEADER)
    if not is_data_url(url) or comma < 0:
        raise UnsupportedImageError("malformed data: URL (expected data:<mime>;base64,<data>)")
    header = url[5:comma].lower()
    mime, *params = header.split(";")
    if "base64" not in params:
        raise UnsupportedImageError("only base64 data: URLs are supported (data:<mime>;base64,…)")
    if not _MIME.fullmatch(mime):
        raise UnsupportedImageError(f"data: URL type {mime or '(none)'!r} is not an image type")
    payload = url[comma + 1 :]
    if len(payload) % 4:
        raise UnsupportedImageError("data: URL payload is not valid base64 (length not a multiple of 4)")
    size = decoded_size(payload)
    if size > max_bytes:
        raise ImageTooLargeError(f"data: URL image is {size} bytes, over the {max_bytes}-byte image limit")
    if size <= 0:
        raise UnsupportedImageError("data: URL holds no data")
    return DataURL(mime=mime, payload=payload)


def decode_payload(data_url: DataURL) -> bytes:
    """Strict base64 decode of a parsed data: URL (no whitespace, no data after padding)."""
    try:
        # pybase64 (SIMD): ~60 µs for 1 MiB where binascii takes ~3.5 ms; validate=True is at
        # least as strict as binascii's strict_mode (no whitespace, no data after padding).
        return pybase64.b64decode(data_url.payload, validate=True)
    except (binascii.Error, ValueError) as exc:  # ValueError: non-ASCII characters
        raise UnsupportedImageError(f"data: URL payload is not valid base64 ({exc})") from exc


def forwarded_as(url: str, mime: str, data: bytes) -> bool:
    """Whether ``url``, a data: URL strictly decoded to ``data`` (``decode_payload``), is the one the
    gateway forwards for it: ``data:{mime};base64,`` and canonical base64. Each whole quartet of
    strictly decoded base64 is its 3 bytes' only spelling, so only the header, the length and the
    last quartet (its padding and unused bits) can differ: checked without encoding the rest."""
    header = f"data:{mime};base64,"
    n = len(data)
    if not n or not url.startswith(header) or len(url) != len(header) + 4 * -(-n // 3):
        return False
    return url.endswith(pybase64.b64encode_as_string(data[n - (n % 3 or 3) :]))
