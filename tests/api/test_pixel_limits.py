"""Validation work per request is bounded, through a real ``mmgate serve`` process: a request whose
images add up to more pixels than ``--max-request-pixels`` is refused before it costs more, and a
full queue of large-image decodes answers 429 with ``Retry-After`` while small images go on, and
a request is admitted to that queue with all its images or with none."""

from __future__ import annotations

import asyncio
import base64
import io
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from PIL import Image

from tests.support.serve_process import metric_value, serve_process

MODEL = "mmgate-sim-vl"


def webp_url(size: int, seed: int) -> str:
    """A flat lossless WEBP: a few dozen bytes, a full decode of every pixel (a PNG is checked by
    its CRCs, not decoded, so it would never reach the decode lanes these tests fill)."""
    buf = io.BytesIO()
    Image.new("L", (size, size), seed).save(buf, "WEBP", lossless=True, method=0)
    return "data:image/webp;base64," + base64.b64encode(buf.getvalue()).decode()


def png_url(size: int, seed: int) -> str:
    buf = io.BytesIO()
    Image.new("L", (size, size), seed).save(buf, "PNG", compress_level=1)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def giants() -> list[str]:
    return [webp_url(4000, seed) for seed in range(18)]  # 16 M pixels each


def queued(gw: Any) -> float:
    """Pixels in the gateway's large decode lane now."""
    return metric_value(gw.metrics(), "mmgate_decode_queue_pixels")


def turn(*urls: str) -> dict[str, Any]:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}, *parts]}]}


async def post(url: str, body: Any) -> tuple[int, dict[str, str], Any]:
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/chat/completions", json=body) as r:
        return r.status, dict(r.headers), await r.json(content_type=None)


async def test_a_request_over_its_pixel_budget_is_refused_naming_the_part(tmp_path: Path, giants: list[str]) -> None:
    with serve_process(tmp_path, "--max-request-pixels", "40000000") as gw:
        status, _, body = await post(gw.url, turn(*giants[:2]))  # 32 M: within
        assert status == 200, body
        status, _, body = await post(gw.url, turn(*giants[2:5]))  # 48 M: the third crosses it
        assert status == 400 and body["error"]["code"] == "image_too_large"
        assert "--max-request-pixels" in body["error"]["message"]
        assert body["error"]["param"].startswith("messages[0].content[")
        # Images the gateway already holds cost it no decode, but the backend would process them:
        # they count too (giants 0 and 1 are cached from the first request).
        status, _, body = await post(gw.url, turn(giants[0], giants[1], giants[5]))
        assert status == 400 and body["error"]["param"] == "messages[0].content[3]", body


async def test_a_full_large_image_queue_is_a_429_and_small_images_still_pass(tmp_path: Path, giants: list[str]) -> None:
    with serve_process(tmp_path, "--max-decode-queue-pixels", "35000000", "--large-image-pixels", "1000000") as gw:
        # Six requests at once, one 16 M-pixel image each: two fit the 35 M queue, the rest are told
        # to come back (a few rounds, in case a decode ends before the others arrive).
        for round_ in range(3):  # new images each round: a cached image is not decoded again
            results = await asyncio.gather(*(post(gw.url, turn(giants[6 * round_ + i])) for i in range(6)))
            statuses = [r[0] for r in results]
            if 429 in statuses and 200 in statuses:
                break
        assert 429 in statuses and 200 in statuses, statuses
        busy = next(r for r in results if r[0] == 429)
        assert busy[1]["Retry-After"] == "1" and busy[2]["error"]["code"] == "gateway_busy"
        started = time.perf_counter()
        status, _, _ = await post(gw.url, turn(png_url(64, 7)))
        assert status == 200 and time.perf_counter() - started < 5


async def test_a_request_is_admitted_to_the_large_lane_whole_or_not_at_all(tmp_path: Path) -> None:
    # A 100 M-pixel queue holding request 1's two 39.7 M-pixel decodes has room for one more 16 M
    # image, not two: request 2 (two such images) must get its 429 before either is decoded. Per
    # image, its first image was admitted and decoded (and cached) for a request that failed.
    with serve_process(tmp_path, "--max-decode-queue-pixels", "100000000", "--large-image-pixels", "1000000") as gw:
        for attempt in range(5):  # request 1 must still be decoding when request 2 asks
            first, second = webp_url(4000, 2 * attempt), webp_url(4000, 2 * attempt + 1)
            giants = webp_url(6300, 10 + 2 * attempt), webp_url(6300, 11 + 2 * attempt)
            busy = asyncio.create_task(post(gw.url, turn(*giants)))
            # Until request 1's two decodes are in the lane (parsing its body takes a while on a
            # loaded machine), then at once: the window ends when its first decode does.
            async with asyncio.timeout(10):
                while await asyncio.to_thread(queued, gw) < 2 * 6300 * 6300 and not busy.done():
                    await asyncio.sleep(0.005)
            status, headers, body = await post(gw.url, turn(first, second))
            assert (await busy)[0] == 200
            if status == 429:
                break
            assert status == 200, body
        assert status == 429 and headers["Retry-After"] == "1" and body["error"]["code"] == "gateway_busy", body
        await asyncio.sleep(2)  # time for a decode that was wrongly admitted to end (and be cached)
        # Only request 1's images were decoded: request 2's are in no cache (nor those of request
        # 2 in earlier attempts, answered 200).
        entries = metric_value(gw.metrics(), "mmgate_local_cache_entries")
        assert entries == 4 * attempt + 2, (entries, attempt)
        loads = metric_value(gw.metrics(), "mmgate_image_loads_total", outcome="local_hit")
        status, _, body = await post(gw.url, turn(first))
        assert status == 200, body
        assert metric_value(gw.metrics(), "mmgate_image_loads_total", outcome="local_hit") == loads
