"""What an image weighs for routing: the prompt tokens it costs, or its bytes when its size is unknown.

The weight says how much work a backend saves by already holding the image, so a request's
images are compared by it. Qwen2-VL (and the embedded ``sim``, which follows it) resizes each
side to a multiple of 28 pixels (14-pixel patches merged 2x2) with the area kept within
[min_pixels, max_pixels], and an image then costs one token per 28x28 cell: ``image_tokens``
applies the same rule (``mmgate.vllm_protocol.smart_resize``) without importing the processor. Pure; no I/O.
"""

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
def image_tokens(
    width: int, height: int, *, factor: int = GRID_FACTOR, min_pixels: int = MIN_PIXELS,
    max_pixels: int = MAX_PIXELS,
) -> int:
    """Prompt tokens of a ``width`` x ``height`` image on a Qwen2-VL-like grid (at least 1).

    The model's ``smart_resize`` (``mmgate.vllm_protocol``, the rule the sim's processor applies too):
    round each side to the grid, scale down past ``max_pixels`` or up below ``min_pixels``.
    """
    if width <= 0 or height <= 0:
        return 1
    h_bar, w_bar = smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
    return max(1, (h_bar // factor) * (w_bar // factor))


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
