"""The processor cache over HTTP: uuid hits, cache-only references, content hashes, eviction."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from openai import AsyncOpenAI, BadRequestError

from mmgate.app_runtime import start_app
from mmgate.sim.server import SimServer
from tests.sim.conftest import SimFactory
from tests.sim.helpers import cache_gb, chat_body, data_url, image_bytes, image_part, post_chat

MISS_BODY_0 = {"error": {"message": "Cache miss for image at index 0 but data is not provided.",
                         "type": "BadRequestError", "param": None, "code": 400}}
# 64x64 → 56x56 pixels → 16 patches of 3*14*14 float32.
SMALL_ITEM_BYTES = 16 * 3 * 14 * 14 * 4


async def test_uuid_then_cache_only_reference_hits(http: aiohttp.ClientSession, sim: SimServer) -> None:
    img = data_url(image_bytes(seed=1))
    status, first = await post_chat(http, sim, chat_body(image_part(img, uuid="u1"), max_tokens=2))
    assert status == 200
    assert (sim.stats.cache_queries, sim.stats.cache_hits, sim.stats.images_processed) == (1, 0, 1)
    bytes_after_first = sim.stats.image_bytes_received
    assert bytes_after_first == len(image_bytes(seed=1))
    for ref in ({"type": "image_url", "image_url": None, "uuid": "u1"},
                {"type": "image_url", "image_url": {}, "uuid": "u1"},
                {"type": "image_url", "image_url": {"url": ""}, "uuid": "u1"}):
        status, out = await post_chat(http, sim, chat_body(ref, max_tokens=2))
        assert status == 200, out
        assert out["usage"]["prompt_tokens"] == first["usage"]["prompt_tokens"]
        assert out["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
    assert (sim.stats.cache_queries, sim.stats.cache_hits, sim.stats.images_processed) == (4, 3, 1)
    assert sim.stats.image_bytes_received == bytes_after_first  # references carry no bytes
    # No image_url key at all is vLLM 0.32's 400 (its words), and moves no counter.
    status, out = await post_chat(http, sim, chat_body({"type": "image_url", "uuid": "u1"}, max_tokens=2))
    assert (status, out["error"]["message"]) == (400, "Missing 'type' field in multimodal part. (parameter=type)")
    assert (sim.stats.cache_queries, sim.stats.cache_hits) == (4, 3)
    # Resending the data with the uuid is a hit too (decoded, as vLLM does, but not processed).
    status, _ = await post_chat(http, sim, chat_body(image_part(img, uuid="u1"), max_tokens=2))
    assert status == 200
    assert (sim.stats.cache_hits, sim.stats.images_processed, sim.stats.images_decoded_on_hit) == (4, 1, 1)


async def test_concurrent_requests_with_one_new_image_process_it_once(
    http: aiohttp.ClientSession, sim: SimServer
) -> None:
    # vLLM looks up and processes one request's images at a time (its renderer's single-worker
    # executor), so the second of two requests showing the same new image hits the cache.
    img = data_url(image_bytes(448, 448, seed=9))
    bodies = [chat_body(image_part(img), max_tokens=2) for _ in range(4)]
    results = await asyncio.gather(*(post_chat(http, sim, b) for b in bodies))
    assert [status for status, _ in results] == [200] * 4
    assert (sim.stats.images_processed, sim.stats.cache_queries, sim.stats.cache_hits) == (1, 4, 3)


async def test_cache_only_miss_is_vllm_400(http: aiohttp.ClientSession, sim: SimServer) -> None:
    status, body = await post_chat(http, sim, chat_body(image_part(uuid="never-sent")))
    assert status == 400 and body == MISS_BODY_0
    # The index counts the request's images in order, across messages.
    img = data_url(image_bytes(seed=2))
    body2 = chat_body(image_part(img, uuid="a"))
    body2["messages"].append({"role": "user", "content": [image_part(img), image_part(uuid="missing")]})
    status, body = await post_chat(http, sim, body2)
    assert status == 400
    assert body["error"]["message"] == "Cache miss for image at index 2 but data is not provided."
    assert sim.stats.images_processed == 0  # vLLM checks the cache before processing anything


async def test_reference_to_image_sent_earlier_in_same_request_misses(
    http: aiohttp.ClientSession, sim: SimServer
) -> None:
    # vLLM queries the cache for every item before inserting this request's own images.
    body = chat_body(image_part(data_url(image_bytes(seed=3)), uuid="dup"), image_part(uuid="dup"))
    status, out = await post_chat(http, sim, body)
    assert status == 400
    assert out["error"]["message"] == "Cache miss for image at index 1 but data is not provided."


async def test_sdk_sees_cache_miss_as_bad_request(sim: SimServer) -> None:
    async with AsyncOpenAI(base_url=f"{sim.url}/v1", api_key="x", max_retries=0) as client:
        with pytest.raises(BadRequestError) as info:
            await client.chat.completions.create(
                model="mmgate-sim-vl",
                messages=[{"role": "user", "content": [image_part(uuid="nope")]}],  # type: ignore[list-item]
            )
    assert info.value.status_code == 400
    assert "Cache miss for image at index 0" in info.value.message


async def test_content_hash_hit_without_uuid(http: aiohttp.ClientSession, sim: SimServer) -> None:
    img = data_url(image_bytes(seed=4))
    for _ in range(3):
        status, _ = await post_chat(http, sim, chat_body(image_part(img), max_tokens=1))
        assert status == 200
    assert (sim.stats.cache_queries, sim.stats.cache_hits, sim.stats.images_processed) == (3, 2, 1)
    # The same bytes as a JPEG are different content: a miss.
    status, _ = await post_chat(http, sim, chat_body(image_part(data_url(image_bytes(seed=4, fmt="JPEG"),
                                                                           "image/jpeg")), max_tokens=1))
    assert status == 200 and sim.stats.images_processed == 2


async def test_byte_bounded_eviction(http: aiohttp.ClientSession, make_sim: SimFactory) -> None:
    sim = await make_sim(mm_processor_cache_gb=cache_gb(2 * SMALL_ITEM_BYTES + 100))
    for key, seed in (("a", 10), ("b", 11), ("c", 12)):
        status, _ = await post_chat(http, sim, chat_body(image_part(data_url(image_bytes(seed=seed)), uuid=key)))
        assert status == 200
    assert sim.engine.cache.num_cached_bytes == 2 * SMALL_ITEM_BYTES
    assert sim.stats.cache_evictions == 1
    status, out = await post_chat(http, sim, chat_body(image_part(uuid="a")))
    assert status == 400 and out == MISS_BODY_0
    for key in ("b", "c"):
        status, _ = await post_chat(http, sim, chat_body(image_part(uuid=key)))
        assert status == 200


async def test_disabled_cache_processes_every_time(http: aiohttp.ClientSession, make_sim: SimFactory) -> None:
    sim = await make_sim(mm_processor_cache_gb=0)
    img = data_url(image_bytes(seed=5))
    for _ in range(2):
        status, _ = await post_chat(http, sim, chat_body(image_part(img, uuid="u")))
        assert status == 200
    assert sim.stats.images_processed == 2 and sim.stats.cache_queries == 0
    status, out = await post_chat(http, sim, chat_body(image_part(uuid="u")))
    assert status == 400 and out == MISS_BODY_0


@pytest.fixture
async def origin() -> AsyncIterator[str]:
    """A loopback image origin: /img.png, /missing (404), /big (over the byte cap)."""
    png = image_bytes(96, 80, seed=6)

    async def img(_: web.Request) -> web.Response:
        return web.Response(body=png, content_type="image/png")

    async def big(_: web.Request) -> web.Response:
        return web.Response(body=b"\0" * 5000, content_type="image/png")

    app = web.Application()
    app.router.add_get("/img.png", img)
    app.router.add_get("/big", big)
    runner, port = await start_app(app, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_http_image_urls(http: aiohttp.ClientSession, make_sim: SimFactory, origin: str) -> None:
    sim = await make_sim(max_image_bytes=4000)
    for _ in range(2):
        status, out = await post_chat(http, sim, chat_body(image_part(f"{origin}/img.png"), max_tokens=1))
        assert status == 200, out
    assert sim.stats.image_bytes_received == 2 * len(image_bytes(96, 80, seed=6))
    assert (sim.stats.cache_hits, sim.stats.images_processed) == (1, 1)
    status, out = await post_chat(http, sim, chat_body(image_part(f"{origin}/missing")))
    assert status == 400 and "HTTP 404" in out["error"]["message"]
    status, out = await post_chat(http, sim, chat_body(image_part(f"{origin}/big")))
    assert status == 400 and "exceeds the limit" in out["error"]["message"]
    status, out = await post_chat(http, sim, chat_body(image_part("file:///etc/passwd")))
    assert status == 400 and "scheme" in out["error"]["message"]


async def test_image_sent_with_bytes_costs_its_modelled_time(
        http: aiohttp.ClientSession, make_sim: SimFactory) -> None:
    """``--sent-us-per-image-token``: an image that arrives with its bytes pays it on a hit too (vLLM
    parses, decodes and hashes what it is sent), a cache-only reference does not. 224px = 64 tokens:
    64 x 4 ms = 0.256 s modelled, every other modelled time 0."""
    sim = await make_sim(speedup=1.0, sent_us_per_image_token=4000.0, decode_ms_per_token=0.0,
                         prefill_us_per_text_token=0.0, prefill_us_per_image_token=0.0)
    url = data_url(image_bytes(224, 224))

    async def timed(part: dict[str, Any]) -> float:
        start = time.perf_counter()
        status, _ = await post_chat(http, sim, chat_body(part, max_tokens=1))
        assert status == 200
        return time.perf_counter() - start

    miss = await timed(image_part(url, uuid="u1"))
    hit_with_bytes = await timed(image_part(url, uuid="u1"))
    reference = await timed(image_part(None, uuid="u1"))
    assert miss >= 0.25 and hit_with_bytes >= 0.25, (miss, hit_with_bytes)
    assert reference < 0.2, reference


@pytest.mark.parametrize("serial", [False, True])
async def test_serial_prefill_makes_concurrent_prefills_take_turns(
        http: aiohttp.ClientSession, make_sim: SimFactory, serial: bool) -> None:
    """``--serial-prefill`` (the CPU profile's): three requests that arrive together get their first
    tokens one prefill after another (0.3, 0.6, 0.9 s); without it each as if alone (0.3 s)."""
    sim = await make_sim(speedup=1.0, serial_prefill=serial, request_overhead_ms=300.0, decode_ms_per_token=0.0,
                         prefill_us_per_text_token=0.0)

    async def timed() -> float:
        start = time.perf_counter()
        status, _ = await post_chat(http, sim, chat_body(max_tokens=1))
        assert status == 200
        return time.perf_counter() - start

    times = sorted(await asyncio.gather(timed(), timed(), timed()))
    if serial:
        assert times[2] >= 0.85 and 0.55 <= times[1] < 0.85, times
    else:
        assert times[2] < 0.55, times
