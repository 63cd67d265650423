"""Decode bombs, real files: a progressive JPEG whose last scan is repeated (Pillow decodes every
copy) and a PNG of empty ancillary chunks with valid CRCs (Pillow walks every one). For the
structure checks' tests and ``benchmarks/regression/decode_bombs.py``."""

from __future__ import annotations

import io
import struct
import zlib

from PIL import Image


def progressive_jpeg(size: int = 64) -> bytes:
    buf = io.BytesIO()
    Image.radial_gradient("L").resize((size, size)).convert("RGB").save(buf, "JPEG", progressive=True, quality=90)
    return buf.getvalue()


def many_scans(extra: int, size: int = 64) -> bytes:
    """A progressive JPEG whose last scan is repeated ``extra`` more times before EOI."""
    data = progressive_jpeg(size)
    last = data.rindex(b"\xff\xda")
    scan = data[last:-2]  # SOS header and its entropy-coded data, up to EOI
    return data[:-2] + scan * extra + b"\xff\xd9"


def chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def png(size: int = 32, *, ancillary: int = 0, idat_piece: int | None = None,
        compressed: bytes | None = None) -> bytes:
    """A grey PNG written chunk by chunk: ``ancillary`` empty tEXt chunks before its data, its
    compressed data cut into IDAT chunks of ``idat_piece`` bytes (one chunk when None).
    ``compressed``: the IDAT data to write instead of the image's (each chunk's CRC still right)."""
    raw = b"".join(b"\x00" + bytes([i % 256]) * size for i in range(size))
    compressed = compressed if compressed is not None else zlib.compress(raw, 1)
    piece = idat_piece or len(compressed)
    head = chunk(b"IHDR", struct.pack(">IIBBBBB", size, size, 8, 0, 0, 0, 0))
    text = chunk(b"tEXt", b"k\x00") * ancillary
    idat = b"".join(chunk(b"IDAT", compressed[i:i + piece]) for i in range(0, len(compressed), piece))
    return b"\x89PNG\r\n\x1a\n" + head + text + idat + chunk(b"IEND", b"")
