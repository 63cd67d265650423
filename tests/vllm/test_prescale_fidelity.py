"""Prescaling against vLLM's own image path (``mmgate.media.prescale``): each image is loaded by
vLLM 0.32's loader (``ImageMediaIO``: EXIF orientation, RGB over white) and run through the tiny
Qwen2-VL's image processor, once as the client sent it and once as the gateway prescaled it. With
Pillow's processor (vLLM ``--mm-processor-kwargs '{"use_fast": false}'``) the pixel values the
model receives are identical; with the default torchvision processor they differ by its own
bicubic rounding, bounded here; the grid (the image's tokens) is the same in both.

Runs in the vLLM venv (a subprocess): no replica is started.
"""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess

import pytest
from PIL import Image

from mmgate.media.prescale import Prescale, prescaled
from tests.support.images import make_image
from tests.support.vllm import VllmSetup, VllmUnavailable

# The tiny model's processor keeps at most 1,003,520 pixels (Qwen2-VL's 1280 x 28 x 28).
RULE = Prescale(max_pixels=1_003_520)
FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP")
# The torchvision processor's bicubic filter against Pillow's, in normalised units (one level in
# 255 is ~0.015 after the processor's std of ~0.27).
TORCH_BOUND = 0.05

_COMPARE = """
import base64, json, sys
import torch
from transformers import AutoImageProcessor
from vllm.multimodal.media.image import ImageMediaIO
pairs = json.loads(sys.stdin.read())
io_ = ImageMediaIO()
out = {}
for fast in (False, True):
    proc = AutoImageProcessor.from_pretrained(sys.argv[1], use_fast=fast)
    rows = []
    for name, a, b in pairs:
        x, y = (proc(images=[io_.load_bytes(base64.b64decode(d)).media], return_tensors="pt") for d in (a, b))
        rows.append({"name": name, "grid_same": bool(torch.equal(x["image_grid_thw"], y["image_grid_thw"])),
                     "grid": x["image_grid_thw"].tolist(), "class": type(proc).__name__,
                     "max_diff": float((x["pixel_values"] - y["pixel_values"]).abs().max())
                     if x["pixel_values"].shape == y["pixel_values"].shape else None})
    out["fast" if fast else "pil"] = rows
print(json.dumps(out))
"""


def _images() -> dict[str, bytes]:
    rotated = io.BytesIO()
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.open(io.BytesIO(make_image("JPEG", 2000, 1200, seed=2))).save(rotated, "JPEG", exif=exif.tobytes())
    rgba = Image.new("RGBA", (1700, 1100), (200, 10, 10, 0))
    rgba.paste((10, 200, 10, 180), (0, 0, 900, 1100))
    transparent = io.BytesIO()
    rgba.save(transparent, "PNG")
    return {"png": make_image("PNG", 1600, 1000, seed=1), "jpeg-exif-rotated": rotated.getvalue(),
            "rgba-png": transparent.getvalue(), "webp": make_image("WEBP", 1500, 1500, seed=3)}


def test_prescaled_images_give_vllms_processor_the_same_pixels() -> None:
    if os.environ.get("MMGATE_SKIP_VLLM") == "1" and not os.environ.get("CI"):
        pytest.skip("MMGATE_SKIP_VLLM=1: real-vLLM tests skipped on request")
    try:
        setup = VllmSetup.locate()
    except VllmUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    model = setup.ensure_model()
    pairs = []
    for name, data in _images().items():
        small = prescaled(data, RULE, FORMATS)
        assert small is not None, name
        pairs.append([name, base64.b64encode(data).decode(), base64.b64encode(small[0]).decode()])
    done = subprocess.run([str(setup.python), "-c", _COMPARE, str(model)], input=json.dumps(pairs), text=True,
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for row in result["pil"]:
        assert row["class"].endswith("Pil"), row
        assert row["grid_same"] and row["max_diff"] == 0.0, row
    for row in result["fast"]:
        assert row["grid_same"] and row["max_diff"] is not None and row["max_diff"] <= TORCH_BOUND, row
