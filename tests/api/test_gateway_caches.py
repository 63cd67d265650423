"""Image caches seen through real gateways: two gateways sharing a real Redis (standalone and a
3-node cluster) fetch a URL from the origin once; 50 concurrent requests make one origin request;
a stopped Redis costs nothing but the cache."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp

from tests.support.gateway import gateway_settings, running_gateway
from tests.support.http import post
from tests.support.images import make_image
from tests.support.origin import ImageOrigin
from tests.support.redis_servers import RedisTarget, running_standalone

MODEL = "mmgate-sim-vl"


def body(url: str) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is it?"}, {"type": "image_url", "image_url": {"url": url}}]}]}


async def test_second_gateway_gets_a_shared_hit(redis_target: RedisTarget, origin: ImageOrigin) -> None:
    url = origin.add(f"cat-{redis_target.kind}.png", make_image("PNG", 128, 96, seed=1))
    path = f"/img/cat-{redis_target.kind}.png"
    cache = {"redis_url": redis_target.url, "redis_cluster": redis_target.cluster}
    async with running_gateway(gateway_settings(cache=cache)) as gw1, running_gateway(
        gateway_settings(cache=cache)
    ) as gw2, aiohttp.ClientSession() as s:
        assert (await post(gw1.url, body(url), session=s)).status == 200
        assert (await post(gw2.url, body(url), session=s)).status == 200
        assert origin.hits[path] == 1
        loads = gw2.gateway.loader.metrics.image_loads
        assert loads.labels(outcome="shared_hit")._value.get() == 1


async def test_fifty_concurrent_requests_make_one_origin_request(origin: ImageOrigin) -> None:
    url = origin.add("dog.png", make_image("PNG", 128, 96, seed=2))
    path = "/img/dog.png"
    async with running_gateway() as gw, aiohttp.ClientSession() as s:
        replies = await asyncio.gather(*(post(gw.url, body(url), session=s) for _ in range(50)))
        assert [r.status for r in replies] == [200] * 50
        assert origin.hits[path] == 1


async def test_redis_down_every_request_still_succeeds(tmp_path: Path, origin: ImageOrigin) -> None:
    with running_standalone(tmp_path) as server:
        cache = {"redis_url": server.url, "redis_io_timeout_s": 0.3, "redis_connect_timeout_s": 0.3}
        async with running_gateway(gateway_settings(cache=cache)) as gw, aiohttp.ClientSession() as s:
            first = origin.add("a.png", make_image("PNG", 64, 64, seed=3))
            assert (await post(gw.url, body(first), session=s)).status == 200
            server.stop()
            for i in range(5):
                url = origin.add(f"b{i}.png", make_image("PNG", 64, 64, seed=10 + i))
                assert (await post(gw.url, body(url), session=s)).status == 200
                assert origin.hits[f"/img/b{i}.png"] == 1


async def test_a_repeated_uuid_and_url_is_not_loaded_again(origin: ImageOrigin) -> None:
    url = origin.add("shot.png", make_image("PNG", 96, 64, seed=4))
    part = {"type": "image_url", "image_url": {"url": url}, "uuid": "shot-1"}
    payload = {"model": MODEL, "messages": [{"role": "user", "content": [part]}]}
    # No media cache at all: only the uuid store can spare the second download.
    async with running_gateway(gateway_settings(cache={"local_cache_bytes": 0})) as gw, aiohttp.ClientSession() as s:
        assert (await post(gw.url, payload, session=s)).status == 200
        assert (await post(gw.url, payload, session=s)).status == 200
        assert origin.hits["/img/shot.png"] == 1
        # Another uuid for the same URL is a new image to the gateway: loaded again.
        other = {"model": MODEL, "messages": [{"role": "user", "content": [{**part, "uuid": "shot-2"}]}]}
        assert (await post(gw.url, other, session=s)).status == 200
        assert origin.hits["/img/shot.png"] == 2
