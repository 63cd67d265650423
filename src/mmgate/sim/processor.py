"""The HF-processor stand-in: decode, resize to the patch grid, normalise, patchify.

Blocking functions (Pillow and numpy); the engine runs them in its thread pool. Pillow's many
exception types are translated here, at one boundary, into ``InvalidRequestError`` (vLLM answers
an undecodable image with 400).
"""

from __future__ import annotations

import hashlib
import io
import re
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image

from mmgate.sim.cache import ProcessedImage
from mmgate.sim.config import SimSettings
from mmgate.sim.errors import ImageTooLargeError, InvalidRequestError
from mmgate.vllm_protocol import smart_resize as grid_resize


def content_hash(data: bytes) -> str:
    """Cache key of an image sent without a uuid: hex SHA-256 of its encoded bytes.

    (vLLM hashes the decoded pixels; hashing the encoded bytes gives the same hits for the same
    file and is what the gateway uses as a content uuid.)
    """
    return hashlib.sha256(data).hexdigest()


def smart_resize(
    height: int, width: int, *, factor: int, min_pixels: int, max_pixels: int, max_aspect_ratio: float
) -> tuple[int, int]:
    """Qwen2-VL's resize rule (``mmgate.vllm_protocol.smart_resize``) after vLLM's checks: no empty side,
    aspect ratio below ``max_aspect_ratio``. Returns ``(height, width)``."""
    if height <= 0 or width <= 0:
        raise InvalidRequestError(f"Image has an empty side ({width}x{height}).")
    if max(height, width) / min(height, width) > max_aspect_ratio:
        raise InvalidRequestError(
            f"absolute aspect ratio must be smaller than {max_aspect_ratio:g}, "
            f"got {max(height, width) / min(height, width):g}"
        )
    return grid_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)


_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def decode_image(data: bytes, settings: SimSettings) -> Image.Image:
    """Decode encoded image bytes to an RGB Pillow image (what vLLM's media loader does)."""
    if not data:
        raise InvalidRequestError("Failed to load image: the image data is empty.")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            width, height = image.size
            if width * height > settings.max_image_pixels:
                raise ImageTooLargeError(
                    f"Image of {width}x{height} pixels exceeds the limit of "
                    f"{settings.max_image_pixels} pixels."
                )
            image.load()
            return image.convert("RGB")
    except ImageTooLargeError:
        raise
    except Exception as exc:  # Pillow raises OSError, ValueError, SyntaxError, EOFError... on bad data
        # vLLM's words: "Failed to load image: <Pillow's message>", without the object's address.
        raise InvalidRequestError("Failed to load image: " + _ADDRESS.sub("", str(exc))) from exc


def process_image(data: bytes, settings: SimSettings) -> ProcessedImage:
    """Decode, resize to the patch grid, normalise to float32 and split into patches (the work a
    cache miss costs); the record of the result, whose patches are then dropped."""
    pixel_values = patchify(decode_image(data, settings), settings)
    merge = settings.merge_size
    grid_h, grid_w = pixel_values.grid_hw
    return ProcessedImage(grid_h=grid_h, grid_w=grid_w, num_tokens=(grid_h // merge) * (grid_w // merge),
                          num_bytes=int(pixel_values.values.nbytes))


@dataclass(frozen=True, slots=True)
class Patches:
    """Normalised float32 patches, one row per patch (Qwen2-VL's layout without the temporal
    duplication), and the patch grid (rows, columns)."""

    values: np.ndarray
    grid_hw: tuple[int, int]


def patchify(image: Image.Image, settings: SimSettings) -> Patches:
    """Resize to the patch grid, normalise to float32 and split into patches."""
    factor = settings.grid_factor
    height, width = smart_resize(
        image.height,
        image.width,
        factor=factor,
        min_pixels=settings.min_pixels,
        max_pixels=settings.max_pixels,
        max_aspect_ratio=settings.max_aspect_ratio,
    )
    if (width, height) != image.size:
        image = image.resize((width, height), Image.Resampling.BICUBIC)
    pixels = np.asarray(image, dtype=np.float32)  # (H, W, 3)
    pixels *= np.float32(1.0 / 255.0)
    pixels -= np.asarray(settings.image_mean, dtype=np.float32)
    pixels /= np.asarray(settings.image_std, dtype=np.float32)
    patch, merge = settings.patch_size, settings.merge_size
    grid_h, grid_w = height // patch, width // patch
    # Qwen2-VL order: merge windows row by row, the patches of one window together, each patch
    # flattened channel-first.
    patches = pixels.reshape(grid_h // merge, merge, patch, grid_w // merge, merge, patch, 3)
    patches = patches.transpose(0, 3, 1, 4, 6, 2, 5)
    flat = np.ascontiguousarray(patches).reshape(grid_h * grid_w, 3 * patch * patch)
    return Patches(flat, (grid_h, grid_w))
