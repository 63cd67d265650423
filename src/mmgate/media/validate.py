"""Image validation with Pillow: format allow-list, pixel limit, full decode. Blocking: the
loader runs it in its thread pool.

The only module that calls Pillow for media; Pillow's exceptions (``UnidentifiedImageError``,
``OSError`` "truncated", ``SyntaxError`` from some plugins, ``DecompressionBombError`` …) are
translated here into ``UnsupportedImageError`` (415) or ``ImageTooLargeError``.

The pixel limit is checked from the header, before any pixel is decoded. The full decode is
what catches truncated or corrupt data; for JPEG, ``draft()`` decodes at 1/8 scale, which still
entropy-decodes the whole stream (so truncation is caught) at a fraction of the cost.
"""

from __future__ import annotations

import io
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

