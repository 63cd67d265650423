"""Image validation with Pillow: format allow-list, pixel limit, full decode. Blocking: the
loader runs the header probe in its threads (a screenshot-sized PNG's whole check on its event
loop) and the full decode in a worker process (``mmgate.media.decode_procs``).

The only module that calls Pillow for media; Pillow's exceptions (``UnidentifiedImageError``,
``OSError`` "truncated", ``SyntaxError`` from some plugins, ``DecompressionBombError`` …) are
translated here into ``UnsupportedImageError`` (415) or ``ImageTooLargeError``.

The pixel limit is checked from the header, before any pixel is decoded. The full check is what
catches truncated or corrupt data: for JPEG, ``draft()`` decodes at 1/8 scale, which still
entropy-decodes the whole stream (so truncation is caught) at a fraction of the cost; for PNG,
Pillow's ``verify()`` walks every chunk to ``IEND`` checking its CRC, which catches a truncated or
damaged file without inflating a pixel (~0.06 ms for a 1280x800 screenshot, where the decode takes
~10 ms: the agent's screenshot of every turn, decoded again by the backend anyway). A PNG whose
compressed pixels are malformed under intact CRCs (made so on purpose, never by a transfer) is the
backend's to judge, as if it were sent there directly — vLLM 0.32 serves it, with the pixels that
decoded — and cannot cost any decoder more than its header's pixels, checked here. Other formats
are decoded in full.

Pixels do not bound a decode's work on their own: a progressive JPEG of thousands of (empty)
scans costs the decoder a pass over the image per scan, and a PNG of hundreds of thousands of
empty ancillary chunks holds the interpreter in Pillow's chunk walk. ``check_structure`` counts
them before the decode and refuses an image past limits no real encoder reaches: the work is
bounded before it starts, here and in the backend that decodes the image again (the worker
process only bounds the gateway's own decode, by its time limit).
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass

from PIL import Image

from mmgate.errors import ImageTooLargeError, UnsupportedImageError


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """What validation learned about an image."""

    format: str
    mime: str
    width: int
    height: int


def probe_image(data: bytes, *, allowed_formats: tuple[str, ...], max_pixels: int) -> ImageInfo:
    """Format and size from the image's header (no pixel is decoded); the same checks and errors as
    ``validate_image`` up to the decode. Cheap: what decides a decode's lane and budget."""
    return validate_image(data, allowed_formats=allowed_formats, max_pixels=max_pixels, decode=False)


def validate_image(
    data: bytes, *, allowed_formats: tuple[str, ...], max_pixels: int, use_draft: bool = True,
    decode: bool = True,
) -> ImageInfo:
    """Check that ``data`` is a complete image in an allowed format within ``max_pixels``."""
    if not data:
        raise UnsupportedImageError("the image is empty (0 bytes)")
    allowed = ", ".join(allowed_formats)
    check_structure(data)  # before Pillow reads a byte: opening a PNG walks its chunks already
    try:
        with Image.open(io.BytesIO(data), formats=list(allowed_formats)) as img:
            width, height = img.size
            fmt = img.format or "?"
            if width <= 0 or height <= 0:
                raise UnsupportedImageError(f"the {fmt} image has no pixels ({width}x{height})")
            if width * height > max_pixels:
                raise ImageTooLargeError(
                    f"the {fmt} image is {width}x{height} = {width * height} pixels, "
                    f"over the {max_pixels}-pixel limit"
                )
            mime = img.get_format_mimetype() or Image.MIME.get(fmt, "application/octet-stream")
            if not decode:
                return ImageInfo(format=fmt, mime=mime, width=width, height=height)
            if fmt == "PNG":
                img.verify()  # every chunk's CRC through IEND (module docstring)
                return ImageInfo(format=fmt, mime=mime, width=width, height=height)
            if use_draft and fmt == "JPEG":
                img.draft(img.mode, (max(1, width // 8), max(1, height // 8)))
            img.load()
    except (ImageTooLargeError, UnsupportedImageError):
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageTooLargeError(f"the image is over the pixel limit (decompression bomb): {exc}") from exc
    except Image.UnidentifiedImageError as exc:
        raise UnsupportedImageError(f"the data is not an image in an allowed format ({allowed})") from exc
    except MemoryError as exc:
        raise ImageTooLargeError("the image needs too much memory to decode") from exc
    except Exception as exc:  # Pillow raises OSError, SyntaxError, ValueError, struct.error …
        detail = str(exc) or type(exc).__name__
        raise UnsupportedImageError(f"the image data is corrupt or truncated ({detail})") from exc
    return ImageInfo(format=fmt, mime=mime, width=width, height=height)



# Encoders write ~10 scans for a progressive JPEG (libjpeg's and mozjpeg's progressions), one per
# component and band; the limit leaves room for exotic ones. A marker's bytes can also occur in
# metadata (not in entropy-coded data, where 0xFF is stuffed), so the count may only err upward.
MAX_JPEG_SCANS = 100
# PNG: ancillary chunks (text, ICC, EXIF…) are a handful in real files; IDAT chunks follow the
# encoder's buffer (libpng: 8 KiB), so the total is allowed to grow with the file's size.
MAX_PNG_ANCILLARY_CHUNKS = 256
_PNG_CHUNKS_PER_BYTE = 1 / 2048
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_CHUNK_HEAD = struct.Struct(">I4s")


def check_structure(data: bytes) -> None:
    """Refuse (415) an image whose decode work would not be bounded by its pixels: a JPEG of more
    than ``MAX_JPEG_SCANS`` scans, a PNG of too many chunks. Bounded work itself: one C-speed
    search that stops at the JPEG limit, a chunk walk that stops at the PNG limit."""
    if data.startswith(b"\xff\xd8\xff"):
        pos = 0
        for _ in range(MAX_JPEG_SCANS + 1):  # stops at the limit: bounded however many there are
            pos = data.find(b"\xff\xda", pos) + 1
            if pos == 0:
                return
        raise UnsupportedImageError(
            f"the JPEG image has more than {MAX_JPEG_SCANS} scans: re-encode it "
            "(a baseline or standard progressive JPEG)")
    elif data.startswith(PNG_SIGNATURE):
        _check_png_chunks(data)


def _check_png_chunks(data: bytes) -> None:
    limit = 1024 + int(len(data) * _PNG_CHUNKS_PER_BYTE)
    pos, chunks, ancillary = len(PNG_SIGNATURE), 0, 0
    end = len(data) - _CHUNK_HEAD.size
    while pos <= end:
        length, kind = _CHUNK_HEAD.unpack_from(data, pos)
        chunks += 1
        if kind[0] & 0x20:  # lower-case first letter: an ancillary chunk
            ancillary += 1
            if ancillary > MAX_PNG_ANCILLARY_CHUNKS:
                raise UnsupportedImageError(
                    f"the PNG image has more than {MAX_PNG_ANCILLARY_CHUNKS} ancillary chunks: "
                    "strip its metadata and send it again")
        if chunks > limit:
            raise UnsupportedImageError(
                f"the PNG image has more than {limit} chunks for its {len(data)} bytes: re-encode it")
        if kind == b"IEND":
            return
        pos += 12 + length  # length, type, data, CRC
