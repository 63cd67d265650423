"""Test images: real encoded bytes made with Pillow, plus broken ones (bomb, truncated), and
``data:`` URLs of them."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import numpy as np
from PIL import Image


def make_image(fmt: str, width: int = 64, height: int = 48, *, seed: int = 0, noise: float = 0.3) -> bytes:
    """An RGB image of ``width``x``height`` in ``fmt`` (JPEG, PNG, WEBP, GIF, BMP, TIFF …).

    A smooth gradient plus ``noise`` (0 to 1) of random pixels: more noise, more bytes.
    """
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack(
        [x * 255 // max(1, width - 1), y * 255 // max(1, height - 1), (x + y) * 127 // max(1, width + height)],
        axis=-1,
    ).astype(np.float32)
    pixels = base * (1 - noise) + rng.random((height, width, 3), dtype=np.float32) * 255 * noise
    img = Image.fromarray(pixels.clip(0, 255).astype(np.uint8), "RGB")
    out = io.BytesIO()
    if fmt.upper() in ("JPEG", "WEBP"):
        img.save(out, fmt.upper(), quality=90)
    else:
        img.save(out, fmt.upper())
    return out.getvalue()


def image_of_about(fmt: str, num_bytes: int, *, noise: float = 0.3) -> bytes:
    """An image in ``fmt`` whose encoding is within ~15% of ``num_bytes`` (searched by side)."""
    side = 64
    data = make_image(fmt, side, side, noise=noise)
    for _ in range(12):
        side = max(8, int(side * (num_bytes / max(1, len(data))) ** 0.5))
        data = make_image(fmt, side, side, noise=noise)
        if abs(len(data) - num_bytes) <= num_bytes * 0.15:
            break
    return data


def png_bomb(width: int = 20_000, height: int = 20_000) -> bytes:
    """A tiny PNG (tens of KiB) that claims ``width``x``height`` 1-bit pixels, all zero.

    Written by hand (no pixel buffer is ever allocated): decoding it would need widthxheight
    pixels of memory.
    """
    row = b"\x00" * (1 + (width + 7) // 8)  # filter byte + packed bits
    comp = zlib.compressobj(9)
    chunks = []
    rows_per_block = max(1, (1 << 20) // len(row))
    block = row * rows_per_block
    done = 0
    while done < height:
        n = min(rows_per_block, height - done)
        chunks.append(comp.compress(block if n == rows_per_block else row * n))
        done += n
    chunks.append(comp.flush())
    idat = b"".join(chunks)

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)  # 1-bit grayscale
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def truncated(data: bytes, keep: float = 0.6) -> bytes:
    """The first ``keep`` share of ``data`` (an image cut short in transfer)."""
    return data[: max(1, int(len(data) * keep))]


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode("ascii")


def solid_image(width: int = 64, height: int = 64, fmt: str = "PNG", seed: int = 0) -> bytes:
    """A one-colour image with one white marker pixel, both set by ``seed`` (distinct seeds →
    distinct content; cheap to make, unlike ``make_image``)."""
    img = Image.new("RGB", (width, height), ((seed * 37) % 256, (seed * 91) % 256, (seed * 53) % 256))
    img.putpixel((seed % width, (seed // width) % height), (255, 255, 255))
    out = io.BytesIO()
    img.save(out, fmt)
    return out.getvalue()


def png_data_url(seed: int = 0, width: int = 64, height: int | None = None) -> str:
    """``solid_image`` as a PNG ``data:`` URL (square unless ``height`` is given)."""
    return data_url(solid_image(width, height if height is not None else width, "PNG", seed))
