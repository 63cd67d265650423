"""Prescaling (``mmgate.media.prescale``): the gateway forwards an image at the size the backend's
processor resizes it to, with the pixels that processor would compute; only downscales; keyed
apart; a repeat still found without SHA-256. The pixel-for-pixel check against vLLM's own
processor is ``tests/vllm/test_prescale_fidelity.py``."""

from __future__ import annotations

import io

import pytest
from PIL import Image

import mmgate.media.loader as loader_module
from mmgate.errors import UnsupportedImageError
from mmgate.media.dataurl import DataURL
from mmgate.media.prescale import Prescale, as_rgb, prescaled
from mmgate.vllm_protocol import smart_resize
from tests.media.conftest import LoaderFactory
from tests.support.images import data_url, make_image

MICRO = Prescale(max_pixels=100_352)  # the micro Qwen2-VL's cap
FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP")


def _open(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def test_the_target_is_the_processors_size_and_only_a_downscale() -> None:
    assert MICRO.target(1280, 800) == (392, 224)
    h, w = smart_resize(800, 1280, factor=28, min_pixels=56 * 56, max_pixels=100_352)
    assert (w, h) == (392, 224)
    assert MICRO.target(392, 224) is None  # kept as it is by the processor
    assert MICRO.target(300, 200) is None  # enlarged by the processor: forwarded as it came
    assert MICRO.target(30_000, 100) is None  # past the aspect ratio the processor accepts
    assert Prescale(max_pixels=100_352, factor=32).target(1280, 800) == (384, 224)


def test_a_large_image_is_resized_as_the_processor_resizes_it() -> None:
    data = make_image("PNG", 1280, 800, seed=3)
    out = prescaled(data, MICRO, FORMATS)
    assert out is not None
    small, width, height = out
    assert (width, height) == (392, 224)
    image = _open(small)
    assert image.format == "PNG" and image.mode == "RGB" and image.size == (392, 224)
    expected = _open(data).convert("RGB").resize((392, 224), Image.Resampling.BICUBIC)
    assert image.tobytes() == expected.tobytes()
    assert prescaled(make_image("PNG", 300, 200), MICRO, FORMATS) is None


def test_transparency_is_laid_on_white_as_vllm_loads_it() -> None:
    rgba = Image.new("RGBA", (1000, 1000), (200, 10, 10, 0))
    rgba.paste((10, 200, 10, 255), (0, 0, 500, 1000))
    buf = io.BytesIO()
    rgba.save(buf, "PNG")
    out = prescaled(buf.getvalue(), MICRO, FORMATS)
    assert out is not None
    image = _open(out[0])
    assert image.mode == "RGB"
    assert image.getpixel((image.width - 2, 2)) == (255, 255, 255)  # transparent: white, not red
    assert image.getpixel((2, 2)) == (10, 200, 10)
    assert as_rgb(Image.new("L", (4, 4), 7)).getpixel((0, 0)) == (7, 7, 7)


def test_exif_orientation_is_applied_before_the_size_is_chosen() -> None:
    img = _open(make_image("JPEG", 1280, 800, seed=4))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees: displayed 800 wide, 1280 high
    buf = io.BytesIO()
    img.save(buf, "JPEG", exif=exif.tobytes())
    out = prescaled(buf.getvalue(), MICRO, FORMATS)
    assert out is not None and (out[1], out[2]) == (224, 392)


async def test_the_loader_forwards_the_prescaled_image_and_finds_its_repeat(
    make_loader: LoaderFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real = loader_module.payload_digest

    def counted(parsed: DataURL) -> str:
        calls.append(parsed.payload[:16])
        return real(parsed)

    monkeypatch.setattr(loader_module, "payload_digest", counted)
    loader = make_loader(media={"prescale_max_pixels": 100_352})
    url = data_url(make_image("PNG", 1280, 800, seed=5))
    image = await loader.load(url)
    assert (image.width, image.height, image.mime) == (392, 224, "image/png")
    assert _open(image.data).size == (392, 224)
    assert image.data_url() != url and image.source == url
    for _ in range(3):
        assert await loader.load(url) is image
    assert len(calls) == 1  # repeats confirmed against the URL it was made from: no SHA-256
    small = data_url(make_image("PNG", 200, 100, seed=6))
    assert (await loader.load(small)).data_url() == small  # kept as it came: nothing to shrink
    assert (await loader.load(data_url(make_image("JPEG", 1024, 1024, seed=7)))).width == 308


async def test_prescaled_images_are_keyed_apart(make_loader: LoaderFactory) -> None:
    plain, scaled = make_loader(), make_loader(media={"prescale_max_pixels": 100_352})
    url = data_url(make_image("PNG", 1280, 800, seed=8))
    assert (await plain.load(url)).width == 1280
    assert (await scaled.load(url)).width == 392
    assert [k for k, _ in scaled.local.sizes() if k.endswith(MICRO.key_suffix)]
    assert not [k for k, _ in plain.local.sizes() if "~fit" in k]


async def test_a_corrupt_image_is_still_refused(make_loader: LoaderFactory) -> None:
    data = bytearray(make_image("PNG", 1280, 800, seed=9))
    data[len(data) // 2: len(data) // 2 + 64] = b"\x00" * 64  # a damaged IDAT
    loader = make_loader(media={"prescale_max_pixels": 100_352})
    with pytest.raises(UnsupportedImageError):
        await loader.load(data_url(bytes(data)))
