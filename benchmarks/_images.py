"""The images the benchmarks send: seeded, so every run of a script sends the same bytes."""

from __future__ import annotations

import io
import random

from PIL import Image


def seeded_jpeg(seed: int, side: int, *, grain: int, quality: int) -> bytes:
    """A ``side``-pixel square JPEG: a random colour under a blown-up noise tile of ``side //
    grain`` pixels (coarser grain: fewer bytes), at ``quality``; the same bytes for the same
    arguments."""
    rng = random.Random(seed)
    img = Image.new("RGB", (side, side), (rng.randrange(256), rng.randrange(256), rng.randrange(256)))
    tile = side // grain
    noise = Image.frombytes("RGB", (tile, tile), rng.randbytes(tile**2 * 3))
    img.paste(noise.resize((side, side)), (0, 0))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality)
    return buf.getvalue()
