"""Image weights: tokens on the Qwen2-VL grid, the same as the sim's processor computes."""

from __future__ import annotations

import pytest

from mmgate.routing.weights import UNKNOWN_IMAGE_TOKENS, image_tokens, image_weight
from mmgate.sim.config import SimSettings
from mmgate.sim.processor import smart_resize

SIZES = [(1, 1), (27, 29), (56, 56), (448, 448), (640, 480), (1920, 1080), (4000, 3000), (28, 2000),
         (3000, 40), (100, 7000), (1023, 767)]


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_tokens_match_the_sim_processor(width: int, height: int) -> None:
    s = SimSettings()
    h, w = smart_resize(height, width, factor=s.grid_factor, min_pixels=s.min_pixels,
                        max_pixels=s.max_pixels, max_aspect_ratio=10_000)
    assert image_tokens(width, height) == (h // 28) * (w // 28)


def test_known_values() -> None:
    assert image_tokens(448, 448) == 256
    assert image_tokens(1920, 1080) <= 1280  # capped by max_pixels
    assert image_tokens(0, 10) == 1


def test_weight_prefers_tokens_then_bytes() -> None:
    assert image_weight(448, 448, 123_456) == 256.0
    assert image_weight(None, None, 5000) == 5000.0
    assert image_weight(None, None, None) == float(UNKNOWN_IMAGE_TOKENS)
