"""Decode work bounded by structure, not only pixels: a progressive JPEG of thousands of scans and a
PNG of thousands of empty ancillary chunks are refused before any decode; real files pass.

The bombs are real files: the JPEG's extra scans are copies of its own last scan (Pillow still
decodes it, scan after scan), the PNG's chunks carry valid CRCs. Through a real ``mmgate serve``:
the gateway answers 400 naming the part, and the backend is never sent the request."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import aiohttp
import pytest
from PIL import Image

from mmgate.errors import UnsupportedImageError
from mmgate.media.validate import MAX_JPEG_SCANS, MAX_PNG_ANCILLARY_CHUNKS, check_structure, validate_image
from tests.support.bombs import many_scans, png, progressive_jpeg
from tests.support.serve_process import metric_value, serve_process

FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP")


def validate(data: bytes) -> None:
    validate_image(data, allowed_formats=FORMATS, max_pixels=40_000_000)


def test_real_files_pass() -> None:
    normal = progressive_jpeg()
    assert 5 <= normal.count(b"\xff\xda") <= 20  # what an encoder writes
    validate(normal)
    validate(many_scans(MAX_JPEG_SCANS - 20))  # within the limit: decoded as usual
    validate(png(ancillary=10))
    validate(png(512, idat_piece=64))  # many small IDAT chunks: allowed with the file's size


def test_a_jpeg_of_thousands_of_scans_is_refused_before_decoding() -> None:
    bomb = many_scans(3000)
    with Image.open(io.BytesIO(bomb)) as img:  # a valid file: Pillow would decode all of it
        img.load()
    with pytest.raises(UnsupportedImageError, match="more than 100 scans") as err:
        validate(bomb)
    assert err.value.status == 400


def test_a_png_of_many_empty_chunks_is_refused() -> None:
    with pytest.raises(UnsupportedImageError, match="ancillary chunks"):
        validate(png(ancillary=MAX_PNG_ANCILLARY_CHUNKS + 1))
    with pytest.raises(UnsupportedImageError, match="chunks for its"):
        check_structure(png(512, idat_piece=1))  # one IDAT chunk per compressed byte


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


async def test_the_gateway_refuses_decode_bombs_naming_the_part(tmp_path: Path) -> None:
    bombs = [data_url(many_scans(5000), "image/jpeg"),
             data_url(png(ancillary=200_000), "image/png")]  # ~2.6 MB of empty chunks
    with serve_process(tmp_path) as gw:
        async with aiohttp.ClientSession() as s:
            for bomb in bombs:
                body = {"model": "mmgate-sim-vl", "max_tokens": 1, "messages": [{"role": "user", "content": [
                    {"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": bomb}}]}]}
                async with s.post(gw.url + "/v1/chat/completions", json=body) as r:
                    answer = await r.json()
                    assert r.status == 400, answer
                    assert answer["error"]["param"] == "messages[0].content[1]"
            ok = {"model": "mmgate-sim-vl", "max_tokens": 1, "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": data_url(progressive_jpeg(), "image/jpeg")}}]}]}
            async with s.post(gw.url + "/v1/chat/completions", json=ok) as r:
                assert r.status == 200, await r.text()
        # Only the good request reached an engine: one image forwarded with its data.
        assert metric_value(gw.metrics(), "mmgate_images_forwarded_total", mode="data") == 1
