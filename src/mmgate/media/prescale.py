"""Prescaling: an image the gateway loads is downscaled to the size the backend's image processor
would resize it to, before it is forwarded, so the backend decodes a small image, not a large one.

Why: with repeats stripped, what a turn still costs vLLM's API server is its new image, and most of
that is decoding it: a 1280x800 screenshot (PNG) takes ~11-20 ms to decode and its processor ~5 ms
more; the same screenshot at the 392x224 its processor keeps (a model capped at 100,352 pixels)
takes ~2.5 ms for both. The gateway does the decode and the resize instead, once per image (its
caches then hold the small image), in its decode processes; the API server is one process per
engine, the gateways as many as the fleet needs.

What the backend's processor then computes: Qwen2-VL's processors (and the sim) resize each image
to ``smart_resize``'s size (sides multiples of ``factor``, area at most ``max_pixels``) with
bicubic resampling. The gateway opens the image as vLLM's loader does (EXIF orientation applied,
converted to RGB with transparency laid on white: ``vllm.multimodal.media.image``), resizes it to
that same size with Pillow's bicubic filter and sends it as a lossless PNG; the processor finds it
at its target size and leaves its pixels as they are. With Pillow's processor (vLLM
``--mm-processor-kwargs '{"use_fast": false}'``) the model receives the very pixel values it would
have from the original; with the default torchvision processor, whose bicubic filter rounds
differently, values differ by about one level in 255 (``tests/vllm/test_prescale_fidelity.py``
measures both). An operator decides (``--prescale-max-pixels``, off by default), and sets the
model's own ``max_pixels`` and grid factor: the gateway cannot ask vLLM for them.

Only downscales: an image the processor would keep or enlarge is forwarded as it came. Blocking
and Pillow-bound: ``prescaled`` runs in a decode process (``mmgate.media.decode_worker``).
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass

from PIL import Image, ImageOps

from mmgate.vllm_protocol import smart_resize

# Qwen2-VL refuses (``smart_resize``) an image whose sides differ by more than this ratio.
MAX_ASPECT_RATIO = 200
MIN_PIXELS = 56 * 56
# zlib's fastest level: the small image is sent once per backend, and decoded there in ~1 ms.
PNG_COMPRESS_LEVEL = 1


@dataclass(frozen=True, slots=True)
class Prescale:
    """The backend processor's resize rule the gateway applies before forwarding."""

    max_pixels: int
    factor: int = 28

    @property
    def key_suffix(self) -> str:
        """Appended to an image's cache key: a tier shared with gateways of another rule (or none)
        never hands this one an image scaled otherwise."""
        return f"~fit{self.max_pixels}x{self.factor}"

    def target(self, width: int, height: int) -> tuple[int, int] | None:
        """``(width, height)`` the processor resizes a ``width`` x ``height`` image to, when that is
        smaller than the image and the processor keeps an image of that size as it is; else None."""
        if width <= 0 or height <= 0 or max(width, height) > MAX_ASPECT_RATIO * min(width, height):
            return None
        h, w = smart_resize(height, width, factor=self.factor, min_pixels=MIN_PIXELS, max_pixels=self.max_pixels)
        if w * h >= width * height or smart_resize(h, w, factor=self.factor, min_pixels=MIN_PIXELS,
                                                   max_pixels=self.max_pixels) != (h, w):
            return None
        return w, h


def as_rgb(image: Image.Image) -> Image.Image:
    """``image`` in RGB as vLLM's image loader converts it (transparency over a white background)."""
    if image.mode == "RGB":
        return image
    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        rgba = image if image.mode == "RGBA" else image.convert("RGBA")
        out = Image.new("RGB", rgba.size, (255, 255, 255))
        out.paste(rgba, mask=rgba.split()[3])
        return out
    return image.convert("RGB")


def prescaled(data: bytes, spec: Prescale, allowed_formats: tuple[str, ...]) -> tuple[bytes, int, int] | None:
    """The image in ``data`` (validated already) at the processor's size, as PNG bytes, with its
    width and height; None when the processor would not shrink it (then forward ``data``)."""
    with Image.open(io.BytesIO(data), formats=list(allowed_formats)) as opened:
        image: Image.Image = opened
        with contextlib.suppress(Exception):  # as vLLM's loader: a bad EXIF block leaves the image as is
            image = ImageOps.exif_transpose(opened)
        size = spec.target(*image.size)
        if size is None:
            return None
        image.load()
        small = as_rgb(image).resize(size, Image.Resampling.BICUBIC)
    out = io.BytesIO()
    small.save(out, "PNG", compress_level=PNG_COMPRESS_LEVEL)
    return out.getvalue(), size[0], size[1]
