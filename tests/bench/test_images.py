"""Dataset images on the wire: type sniffing, ``data`` and ``origin`` modes, content uuids, the
byte-bounded cache, one preparation for concurrent requests of the same image, and clean errors;
then the built-in image origin over real HTTP on loopback (only dataset files, ETag, counts)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import time
from pathlib import Path

import aiohttp
import pytest

from mmgate.bench.dataset import ImageEntry
from mmgate.bench.errors import BenchError
from mmgate.bench.image_server import ImageOrigin
from mmgate.bench.images import DatasetImages, content_uuid, sniff_image_type
from tests.support.images import make_image


@pytest.mark.parametrize(
    ("fmt", "mime", "ext"),
    [("PNG", "image/png", ".png"), ("JPEG", "image/jpeg", ".jpg"), ("GIF", "image/gif", ".gif"),
     ("WEBP", "image/webp", ".webp"), ("BMP", "image/bmp", ".bmp")],
)
def test_sniff_image_type(fmt: str, mime: str, ext: str) -> None:
    assert sniff_image_type(make_image(fmt, 8, 8)) == (mime, ext)


def test_sniff_unknown_bytes() -> None:
    assert sniff_image_type(b"RIFF\0\0\0\0WAVE") == ("application/octet-stream", ".bin")
    assert sniff_image_type(b"") == ("application/octet-stream", ".bin")


PNG = make_image("PNG", 16, 16)


@pytest.fixture
def png(tmp_path: Path) -> Path:
    path = tmp_path / "shot.png"
    path.write_bytes(PNG)
    return path


async def test_data_mode_inlines_files_with_their_content_uuid(png: Path) -> None:
    images = DatasetImages("data", cache_bytes=1 << 20)
    data = PNG
    prepared = await images.prepare(str(png))
    assert prepared.url == "data:image/png;base64," + base64.b64encode(data).decode()
    assert prepared.content_uuid == hashlib.sha256(data).hexdigest() == content_uuid(data)
    assert prepared.num_bytes == len(data)
    slot = await images.slot(ImageEntry(str(png), "authored"))
    assert (slot.url, slot.authored_uuid, slot.content_uuid) == (prepared.url, "authored", prepared.content_uuid)
    ref = await images.slot(ImageEntry(None, "only-a-ref"))
    assert (ref.url, ref.authored_uuid, ref.content_uuid) == (None, "only-a-ref", None)


async def test_urls_pass_through_and_data_urls_hash_their_bytes() -> None:
    images = DatasetImages("origin", cache_bytes=1 << 20, origin_base_url="http://127.0.0.1:9/")
    url = "https://example.com/a.png"
    web_image = await images.prepare(url)
    assert (web_image.url, web_image.content_uuid, web_image.num_bytes) == (url, content_uuid(url.encode()), 0)
    raw = make_image("JPEG", 8, 8)
    data_url = "data:image/jpeg;base64," + base64.b64encode(raw).decode()
    inline = await images.prepare(data_url)
    assert (inline.url, inline.content_uuid, inline.num_bytes) == (data_url, content_uuid(raw), len(raw))


async def test_bad_sources_are_bench_errors(tmp_path: Path) -> None:
    images = DatasetImages("data", cache_bytes=1 << 20)
    with pytest.raises(BenchError, match="cannot read image"):
        await images.prepare(str(tmp_path / "missing.png"))
    with pytest.raises(BenchError, match="undecodable data: URL"):
        await images.prepare("data:image/png;base64,abc")  # bad padding
    with pytest.raises(BenchError, match="needs the image origin"):
        DatasetImages("origin", cache_bytes=0)


async def test_cache_is_bounded_by_bytes_and_prepares_once(tmp_path: Path) -> None:
    paths = []
    for i in range(6):
        path = tmp_path / f"{i}.png"
        path.write_bytes(make_image("PNG", 16, 16, seed=i))
        paths.append(path)
    one = len((await DatasetImages("data", cache_bytes=1 << 20).prepare(str(paths[0]))).url)
    images = DatasetImages("data", cache_bytes=int(2.5 * one))
    reads = 0
    real = images._prepare_blocking

    def counting(source: str):  # type: ignore[no-untyped-def]
        nonlocal reads
        reads += 1
        return real(source)

    images._prepare_blocking = counting  # type: ignore[method-assign]
    same = await asyncio.gather(*(images.prepare(str(paths[0])) for _ in range(8)))
    assert reads == 1 and len({p.url for p in same}) == 1  # eight concurrent asks, one read
    for path in paths:
        await images.prepare(str(path))
    assert images.cached_bytes <= int(2.5 * one)
    assert reads == 6
    await images.prepare(str(paths[-1]))  # most recent: still cached
    assert reads == 6
    await images.prepare(str(paths[0]))  # evicted long ago: read again
    assert reads == 7


async def test_a_cancelled_preparer_does_not_cancel_the_others(png: Path) -> None:
    images = DatasetImages("data", cache_bytes=1 << 20)
    real = images._prepare_blocking

    def slow(source: str):  # type: ignore[no-untyped-def]
        time.sleep(0.2)  # in the worker thread: the first caller is cancelled meanwhile
        return real(source)

    images._prepare_blocking = slow  # type: ignore[method-assign]
    first = asyncio.create_task(images.prepare(str(png)))
    await asyncio.sleep(0.05)
    second = asyncio.create_task(images.prepare(str(png)))
    await asyncio.sleep(0.05)
    first.cancel()
    prepared = await asyncio.wait_for(second, 5)  # was: CancelledError, as if it had been cancelled
    assert prepared.num_bytes == len(PNG)
    assert first.cancelled()
    third = asyncio.create_task(images.prepare(str(png)))  # cached now
    assert (await third).url == prepared.url


async def test_origin_serves_dataset_files_only_with_etag(png: Path, tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("not a dataset file")
    images_box: list[DatasetImages] = []
    origin = ImageOrigin(lambda name: images_box[0].origin_path(name))
    base = await origin.start()
    try:
        images = DatasetImages("origin", cache_bytes=1 << 20, origin_base_url=base)
        images_box.append(images)
        prepared = await images.prepare(str(png))
        assert prepared.url.startswith(base + "/images/") and prepared.url.endswith(".png")
        async with aiohttp.ClientSession() as http:
            async with http.get(prepared.url) as resp:
                assert resp.status == 200
                assert resp.content_type == "image/png"
                assert await resp.read() == PNG
                etag = resp.headers["ETag"]
            async with http.get(prepared.url, headers={"If-None-Match": etag}) as resp:
                assert resp.status == 304 and await resp.read() == b""
            for name in ("secret.txt", "..%2Fsecret.txt", prepared.content_uuid + ".png"):
                async with http.get(f"{base}/images/{name}") as resp:
                    assert resp.status == 404
        assert origin.stats.requests == 2
        assert origin.stats.bytes_served == len(PNG)  # the 304 sent no body
        assert origin.stats.not_found == 3
    finally:
        await origin.stop()
