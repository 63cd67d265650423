"""A screenshot-sized PNG is checked on the event loop (no trip to a thread); every other image
still goes to the threads. On the loop the check refuses exactly what it refused in a thread: a
damaged CRC, a truncated file, too many chunks, a bomb's header."""

from __future__ import annotations

from typing import Any

import pytest

from mmgate.errors import ImageTooLargeError, UnsupportedImageError
from mmgate.media.loader import MediaLoader
from tests.media.conftest import LoaderFactory
from tests.support.bombs import png
from tests.support.images import data_url, image_of_about, make_image, png_bomb, truncated


def counted(loader: MediaLoader) -> list[str]:
    """Record the name of every function the loader sends to its threads."""
    calls: list[str] = []
    run = loader._lanes.run

    async def counting(pixels: int, fn: Any, *args: object, **kwargs: Any) -> Any:
        calls.append(getattr(fn, "__name__", getattr(getattr(fn, "func", None), "__name__", "?")))
        return await run(pixels, fn, *args, **kwargs)

    loader._lanes.run = counting  # type: ignore[method-assign]
    return calls


async def test_a_small_png_is_checked_without_a_thread(make_loader: LoaderFactory) -> None:
    loader = make_loader()
    calls = counted(loader)
    image = await loader.load(data_url(make_image("PNG", 320, 200)))
    assert image.mime == "image/png" and (image.width, image.height) == (320, 200)
    assert "probe_and_check" not in calls


async def test_other_images_still_go_to_a_thread(make_loader: LoaderFactory) -> None:
    loader = make_loader()
    calls = counted(loader)
    await loader.load(data_url(make_image("JPEG"), "image/jpeg"))
    assert calls.count("probe_and_check") == 1
    big = image_of_about("PNG", 300 * 1024)  # past the bound: its check could hold the loop too long
    assert len(big) > 256 * 1024
    await loader.load(data_url(big))
    assert calls.count("probe_and_check") == 2


@pytest.mark.parametrize("name", ["crc", "truncated", "chunks", "bomb"])
async def test_on_the_loop_bad_pngs_are_refused(make_loader: LoaderFactory, name: str) -> None:
    good = make_image("PNG", 200, 100)
    damaged = bytearray(good)
    damaged[good.index(b"IDAT") + 20] ^= 0xFF  # one byte of pixel data: its chunk's CRC fails
    data = {"crc": bytes(damaged), "truncated": truncated(good), "chunks": png(ancillary=300),
            "bomb": png_bomb()}[name]
    loader = make_loader()
    calls = counted(loader)
    with pytest.raises(ImageTooLargeError if name == "bomb" else UnsupportedImageError):
        await loader.load(data_url(data))
    assert "probe_and_check" not in calls
    assert len(loader.local) == 0  # nothing cached
