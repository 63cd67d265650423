"""Pillow validation: allow-list, pixel limit from the header, truncation, bombs."""

from __future__ import annotations

import pytest

from mmgate.errors import ImageTooLargeError, UnsupportedImageError
from mmgate.media.validate import validate_image
from tests.support.bombs import png
from tests.support.images import make_image, png_bomb, truncated

FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP")


def check(data: bytes, *, formats: tuple[str, ...] = FORMATS, max_pixels: int = 40_000_000,
          use_draft: bool = True) -> tuple[str, int, int]:
    info = validate_image(data, allowed_formats=formats, max_pixels=max_pixels, use_draft=use_draft)
    return info.mime, info.width, info.height


@pytest.mark.parametrize(
    ("fmt", "mime"),
    [("JPEG", "image/jpeg"), ("PNG", "image/png"), ("WEBP", "image/webp"), ("GIF", "image/gif"),
     ("BMP", "image/bmp")],
)
def test_allowed_formats(fmt: str, mime: str) -> None:
    assert check(make_image(fmt, 40, 30)) == (mime, 40, 30)


def test_jpeg_with_and_without_draft_report_full_size() -> None:
    data = make_image("JPEG", 320, 200)
    assert check(data, use_draft=True) == ("image/jpeg", 320, 200)
    assert check(data, use_draft=False) == ("image/jpeg", 320, 200)


def test_format_outside_the_allow_list_is_400() -> None:
    with pytest.raises(UnsupportedImageError) as info:
        check(make_image("TIFF"))
    assert info.value.status == 400
    with pytest.raises(UnsupportedImageError):
        check(make_image("WEBP"), formats=("JPEG", "PNG"))


@pytest.mark.parametrize("data", [b"not an image at all", b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, b"GIF89a"])
def test_garbage_is_400(data: bytes) -> None:
    with pytest.raises(UnsupportedImageError):
        check(data)


def test_empty_is_400() -> None:
    with pytest.raises(UnsupportedImageError, match="empty"):
        check(b"")


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
@pytest.mark.parametrize("keep", [0.3, 0.6, 0.95])
@pytest.mark.parametrize("use_draft", [True, False])
def test_truncated_is_400(fmt: str, keep: float, use_draft: bool) -> None:
    data = make_image(fmt, 256, 256, noise=0.5)
    with pytest.raises(UnsupportedImageError) as info:
        check(truncated(data, keep), use_draft=use_draft)
    assert info.value.status == 400


def test_pixel_limit_is_checked_from_the_header() -> None:
    data = make_image("PNG", 200, 100)
    assert check(data, max_pixels=20_000)[1:] == (200, 100)
    with pytest.raises(ImageTooLargeError, match="200x100"):
        check(data, max_pixels=19_999)


def test_decompression_bomb_is_refused_without_decoding() -> None:
    bomb = png_bomb(20_000, 20_000)  # 400 Mpx, a few tens of KiB
    assert len(bomb) < 200_000
    with pytest.raises(ImageTooLargeError) as info:  # over Pillow's own limit too
        check(bomb)
    assert info.value.status == 400
    smaller = png_bomb(10_000, 5_000)  # 50 Mpx: under Pillow's limit, over ours
    with pytest.raises(ImageTooLargeError, match="10000x5000"):
        check(smaller)


def test_a_png_with_a_damaged_chunk_is_400_without_decoding_its_pixels() -> None:
    data = bytearray(make_image("PNG", 256, 256, noise=0.5))
    idat = data.index(b"IDAT")
    data[idat + 100] ^= 0x55  # one byte of the compressed pixels, as a bad transfer would
    with pytest.raises(UnsupportedImageError, match="broken PNG") as info:
        check(bytes(data))
    assert info.value.status == 400
    # Intact CRCs over malformed pixel data pass: the backend judges that one as it would direct
    # (tests/vllm/test_errors.py); the gateway does not inflate every screenshot to find it.
    assert check(png(64, compressed=b"\x78\x9c" + bytes(range(256)) * 8))[1:] == (64, 64)
