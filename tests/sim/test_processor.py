"""The HF-processor stand-in and the processor cache (pure, no server)."""

from __future__ import annotations

import numpy as np
import pytest

from mmgate.sim.cache import ProcessedImage, ProcessorCache
from mmgate.sim.config import SimSettings
from mmgate.sim.errors import ImageTooLargeError, InvalidRequestError
from mmgate.sim.processor import content_hash, decode_image, patchify, process_image, smart_resize
from tests.sim.helpers import image_bytes

GRID = {"factor": 28, "min_pixels": 56 * 56, "max_pixels": 1280 * 28 * 28, "max_aspect_ratio": 200.0}


@pytest.mark.parametrize(
    ("h", "w", "expected"),
    [
        (64, 64, (56, 56)),
        (300, 512, (308, 504)),
        (28, 28, (56, 56)),  # below min_pixels: scaled up
        (10, 10, (56, 56)),
        (2000, 3000, (812, 1204)),  # over max_pixels: scaled down
    ],
)
def test_smart_resize_matches_qwen2_vl(h: int, w: int, expected: tuple[int, int]) -> None:
    out_h, out_w = smart_resize(h, w, **GRID)
    assert (out_h, out_w) == expected
    assert out_h % 28 == 0 and out_w % 28 == 0
    assert 56 * 56 <= out_h * out_w <= 1280 * 28 * 28


def test_smart_resize_refuses_extreme_aspect_ratio() -> None:
    with pytest.raises(InvalidRequestError, match="aspect ratio"):
        smart_resize(10, 4000, **GRID)


def test_process_image_patches_and_tokens() -> None:
    settings = SimSettings()
    out = process_image(image_bytes(512, 300), settings)
    assert (out.grid_h, out.grid_w) == (22, 36)  # 308/14, 504/14
    assert out.num_tokens == 11 * 18
    patches = patchify(decode_image(image_bytes(512, 300), settings), settings)
    assert patches.values.dtype == np.float32 and patches.grid_hw == (22, 36)
    assert patches.values.shape == (22 * 36, 3 * 14 * 14)
    # The record keeps the patches' size (what vLLM's cache would hold), not the patches.
    assert out.num_bytes == patches.values.nbytes == 22 * 36 * 3 * 14 * 14 * 4
    assert not any(isinstance(getattr(out, f), np.ndarray) for f in out.__slots__)


def test_process_image_normalises_with_mean_and_std() -> None:
    settings = SimSettings()
    out = patchify(decode_image(image_bytes(56, 56, seed=0), settings), settings)  # black, one white pixel
    # Channel-first patch rows: the first 196 values are red, normalised black = -mean/std.
    red = out.values[-1, :196]
    assert np.allclose(red, -settings.image_mean[0] / settings.image_std[0], atol=1e-5)


def test_decode_rejects_garbage_and_huge_images() -> None:
    settings = SimSettings()
    with pytest.raises(InvalidRequestError, match=r"^Failed to load image: cannot identify image file <_io\.BytesIO object>$"):
        decode_image(b"definitely not an image", settings)
    with pytest.raises(InvalidRequestError, match=r"^Failed to load image: cannot identify image file <_io\.BytesIO object>$"):
        decode_image(image_bytes(64, 64)[:40], settings)  # truncated PNG
    with pytest.raises(ImageTooLargeError):
        decode_image(image_bytes(200, 200), SimSettings(max_image_pixels=100 * 100))


def test_content_hash_is_stable_and_content_sensitive() -> None:
    assert content_hash(image_bytes(seed=1)) == content_hash(image_bytes(seed=1))
    assert content_hash(image_bytes(seed=1)) != content_hash(image_bytes(seed=2))


def _item(num_floats: int) -> ProcessedImage:
    return ProcessedImage(grid_h=2, grid_w=2, num_tokens=1, num_bytes=4 * num_floats)


def test_cache_evicts_least_recently_used_by_bytes() -> None:
    cache = ProcessorCache(capacity_bytes=3 * 400)
    for key in "abc":
        assert cache.put(key, _item(100))  # 400 bytes each
    assert cache.get("a") is not None  # a is now the most recent
    cache.put("d", _item(100))
    assert "b" not in cache and {"a", "c", "d"} <= {k for k in "abcd" if k in cache}
    assert cache.num_cached_bytes == 1200 and cache.num_evictions == 1
    cache.put("big", _item(250))  # 1000 bytes: evicts three
    assert len(cache) == 1 and cache.num_cached_bytes == 1000


def test_cache_refuses_oversized_and_replaces_in_place() -> None:
    cache = ProcessorCache(capacity_bytes=1000)
    assert not cache.put("huge", _item(1000))
    assert len(cache) == 0
    cache.put("k", _item(100))
    cache.put("k", _item(200))
    assert len(cache) == 1 and cache.num_cached_bytes == 800
    assert not ProcessorCache(0).put("k", _item(1))
