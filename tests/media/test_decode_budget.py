"""The decode CPU budget through the real loader: an image whose decode costs far more CPU than its
pixels justify is stopped and refused (400 naming the part) and never cached, and the largest
ordinary images the gateway accepts, in the costliest formats and content, pass the default budget.

Real forkserver workers, real images and real bombs (``tests.support.bombs``). The JPEG bombs the
structure check lets through cost under the default budget (PERFORMANCE.md, "Decode bombs"), so
the refusal is tested with a tighter budget set on the loader's own pool (a private attribute: the
budget is a constant, not a setting)."""

from __future__ import annotations

import io

import pytest
from PIL import Image
from prometheus_client import CollectorRegistry

from mmgate.errors import UnsupportedImageError
from mmgate.media.decode import decode_cpu_budget_s
from tests.media.conftest import LoaderFactory
from tests.support.bombs import many_scans
from tests.support.images import data_url

PARAM = "messages[0].content[1]"


def abandoned(registry: CollectorRegistry, reason: str) -> float:
    return registry.get_sample_value("mmgate_image_decodes_abandoned_total", {"reason": reason}) or 0.0


async def test_an_image_past_its_budget_is_refused_and_never_cached(make_loader: LoaderFactory) -> None:
    registry = CollectorRegistry()
    loader = make_loader(registry=registry)
    bomb = data_url(many_scans(90, 2000), "image/jpeg")  # passes the structure check: ~0.25 s of CPU
    loader._lanes.processes.cpu_budget_s = lambda pixels: 0.05 + 10e-9 * pixels  # 0.09 s for it
    for attempt in (1, 2):
        with pytest.raises(UnsupportedImageError) as info:
            await loader.load(bomb, param=PARAM, budget=loader.pixel_budget(1), tenant_tag="t-a")
        assert info.value.status == 400 and info.value.param == PARAM
        assert "far more to decode than its 4000000 pixels justify" in info.value.message
        # Nothing was cached: the second attempt decoded (and was stopped) again.
        assert abandoned(registry, "cpu_budget") == attempt
    assert len(loader.local) == 0
    assert registry.get_sample_value("mmgate_image_loads_total", {"outcome": "local_hit"}) == 0
    loader._lanes.processes.cpu_budget_s = decode_cpu_budget_s
    assert (await loader.load(bomb, param=PARAM, budget=loader.pixel_budget(1))).width == 2000  # the default


SIDE = 6324  # 39,992,976 pixels: the largest square under the default --max-image-pixels (40 M)


def _largest(fmt: str, content: str, **options: object) -> bytes:
    """An image of the largest allowed size that fits the default --max-image-bytes (20 MiB):
    noise (the costliest content for every entropy coder) at the quality that fits, or for PNG (whose
    cost per pixel barely depends on content) a smooth picture with a little noise."""
    if content == "noise":
        noise = Image.effect_noise((SIDE, SIDE), 128).convert("RGB")
    else:
        gradient = Image.radial_gradient("L").resize((SIDE, SIDE)).convert("RGB")
        fractal = Image.effect_mandelbrot((SIDE, SIDE), (-2, -1.5, 1, 1.5), 100).convert("RGB")
        noise = Image.blend(gradient, fractal, 0.5)
    buf = io.BytesIO()
    noise.save(buf, fmt, **options)
    assert len(buf.getvalue()) <= 20 * 2**20, len(buf.getvalue())
    return buf.getvalue()


@pytest.mark.parametrize(("fmt", "content", "options"), [
    ("WEBP", "noise", {"quality": 55, "method": 2}),  # lossy WEBP: the costliest ordinary image per pixel
    ("JPEG", "noise", {"quality": 60, "progressive": True}),
    ("PNG", "smooth", {"compress_level": 6}),
])
async def test_the_largest_ordinary_images_pass_the_default_budget(
    make_loader: LoaderFactory, fmt: str, content: str, options: dict[str, object],
) -> None:
    registry = CollectorRegistry()
    loader = make_loader(registry=registry)
    image = await loader.load(data_url(_largest(fmt, content, **options), f"image/{fmt.lower()}"), param=PARAM,
                              budget=loader.pixel_budget(1))
    assert (image.width, image.height) == (SIDE, SIDE)
    assert sum(abandoned(registry, reason) for reason in ("cpu_budget", "time_limit", "died")) == 0
