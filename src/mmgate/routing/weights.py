"""What an image weighs for routing: the prompt tokens it costs, or its bytes when its size is
unknown. The weight says how much work a backend saves by already holding the image. Pure."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from mmgate.vllm_protocol import smart_resize

GRID_FACTOR = 28
MIN_PIXELS = 56 * 56
MAX_PIXELS = 1280 * 28 * 28
# A cache-only reference whose bytes the gateway does not hold weighs like a mid-size image
# (a 448x448 picture: 256 tokens), so it still counts without dominating.
UNKNOWN_IMAGE_TOKENS = 256


@functools.lru_cache(maxsize=1024)  # a fleet's images come in a few sizes; ~3 µs each otherwise, several a turn
def image_tokens(width: int, height: int) -> int:
    """Prompt tokens of a ``width`` x ``height`` image (at least 1), as Qwen2-VL and the embedded
    ``sim`` count them: each side resized to a multiple of 28 pixels (14-pixel patches merged 2x2)
    with the area within [``MIN_PIXELS``, ``MAX_PIXELS``] (``smart_resize``), one token per 28x28 cell."""
    if width <= 0 or height <= 0:
        return 1
    h_bar, w_bar = smart_resize(height, width, factor=GRID_FACTOR, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    return max(1, (h_bar // GRID_FACTOR) * (w_bar // GRID_FACTOR))


def image_weight(width: int | None, height: int | None, num_bytes: int | None) -> float:
    """Tokens when the pixel size is known, else encoded bytes, else ``UNKNOWN_IMAGE_TOKENS``."""
    if width and height:
        return float(image_tokens(width, height))
    if num_bytes:
        return float(num_bytes)
    return float(UNKNOWN_IMAGE_TOKENS)


@dataclass(frozen=True, slots=True)
class RoutedImage:
    """One image of a request as the router sees it: its backend key and its weight.

    ``key`` is the backend uuid the reuse plan computed (tenant-scoped client uuid or content
    hash): never a metric label, only a hash key.
    """

    key: str
    weight: float
