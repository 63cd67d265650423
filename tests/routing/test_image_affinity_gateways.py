"""Image-affinity routing end to end: real gateway processes (``mmgate serve``) in front of real sim
engines on loopback. Each test fails under today's routing (``--routing session``: no session
header means a random less-loaded pick) or without the bounded-load spill."""

from __future__ import annotations

import asyncio
import base64
from collections import Counter
from contextlib import AsyncExitStack

import aiohttp
import orjson

from mmgate.sim.config import SimSettings
from mmgate.sim.server import SimServer, start_sim
from tests.support.gateway import FAST_SIM, running_sims
from tests.support.gateway_process import gateway_process
from tests.support.images import make_image

MODEL = FAST_SIM.model
AFFINITY = ("--routing", "image-affinity", "--health-interval", "0.2", "--readmit-after", "0")


def data_url(seed: int, side: int = 56) -> str:
    return "data:image/png;base64," + base64.b64encode(make_image("PNG", side, side, seed=seed)).decode()


def body(images: list[str], max_tokens: int = 2) -> bytes:
    parts = [{"type": "text", "text": "compare"}] + [{"type": "image_url", "image_url": {"url": u}} for u in images]
    return orjson.dumps({"model": MODEL, "max_tokens": max_tokens, "messages": [{"role": "user", "content": parts}]})


async def backend_of(client: aiohttp.ClientSession, gateway: str, images: list[str], max_tokens: int = 2) -> str:
    async with client.post(gateway + "/v1/chat/completions", data=body(images, max_tokens),
                           headers={"Content-Type": "application/json"}) as r:
        assert r.status == 200, await r.text()
        await r.read()
        return r.headers["x-mmgate-backend"]


async def test_three_gateways_choose_the_same_backend_and_each_image_is_processed_once() -> None:
    requests = [[data_url(100 + i), data_url(200 + i % 5)] for i in range(16)]
    async with running_sims(4) as sims, AsyncExitStack() as stack:
        urls = [s.url for s in sims]
        gateways = [await stack.enter_async_context(gateway_process(urls, *AFFINITY, hash_seed=seed))
                    for seed in (1, 2, 3)]
        async with aiohttp.ClientSession() as client:
            choices = [[await backend_of(client, gw, images) for gw in gateways] for images in requests]
    assert all(len(set(c)) == 1 for c in choices), choices
    assert len({c[0] for c in choices}) >= 2  # homes spread: not one backend for everything
    # The engines processed each (image, chosen backend) pair once: three gateways cost the fleet
    # what one would (a shared image goes wherever its request's choice went, the same from all).
    pairs = {(u, c[0]) for images, c in zip(requests, choices, strict=True) for u in images}
    assert sum(s.engine.metrics.stats.images_processed for s in sims) == len(pairs)


async def test_a_hot_image_spills_over_under_load_within_the_bound() -> None:
    slow = SimSettings(port=0, speedup=1.0, decode_ms_per_token=20.0)
    hot = data_url(7, 224)  # 64 image tokens: outweighs each request's own 4-token image
    async with running_sims(4, slow) as sims, gateway_process([s.url for s in sims], *AFFINITY) as gw:
        async with aiohttp.ClientSession() as client:
            home = await backend_of(client, gw, [hot])
            # 24 requests at once (each ~0.3 s on its engine), every one with the hot image.
            picks = await asyncio.gather(*(backend_of(client, gw, [hot, data_url(1000 + i, 28)], 16)
                                           for i in range(24)))
    counts = Counter(picks)
    assert len(counts) >= 3, counts  # spilled over
    # The bound: floor(1.3 x 24 / 4) = 7 in flight on one backend at most (a few may have ended).
    assert max(counts.values()) <= 9, counts
    assert counts[home] == max(counts.values()), counts  # the home still takes the largest share


async def test_a_backend_leaving_moves_only_its_images_and_they_come_back() -> None:
    images = [data_url(300 + i) for i in range(32)]
    async with running_sims(4) as sims, gateway_process([s.url for s in sims], *AFFINITY) as gw:
        async with aiohttp.ClientSession() as client:
            before = [await backend_of(client, gw, [u]) for u in images]
            gone = Counter(before).most_common(1)[0][0]
            async with client.get(gw + "/health") as r:
                url_of = {b["name"]: b["url"] for b in orjson.loads(await r.read())["backends"]}
            index = next(i for i, s in enumerate(sims) if s.url == url_of[gone])
            port = sims[index].port
            await sims[index].stop()
            await _until_health(client, gw, gone, healthy=False)
            during = [await backend_of(client, gw, [u]) for u in images]
            restarted: SimServer = await start_sim(FAST_SIM.model_copy(update={"port": port}))
            try:
                await _until_health(client, gw, gone, healthy=True)
                after = [await backend_of(client, gw, [u]) for u in images]
                fresh = [await backend_of(client, gw, [data_url(400 + i)]) for i in range(32)]
            finally:
                await restarted.stop()
    moved = [(b, d) for b, d in zip(before, during, strict=True) if b != d]
    assert moved and all(b == gone for b, _ in moved)  # only the leaver's images moved...
    assert all(d != gone for d in during)
    assert len(moved) == before.count(gone)  # ...all of them
    # Back (restarted: it holds nothing), its homes are back: new images homed there go there...
    assert gone in fresh
    # ...while the images that moved stay where they are held now (a holder beats the home:
    # a holder outweighs the home, HELD_WEIGHT above 1; sending them home would process them again).
    assert after == during


async def _until_health(client: aiohttp.ClientSession, gw: str, name: str, *, healthy: bool) -> None:
    async with asyncio.timeout(10):
        while True:
            async with client.get(gw + "/health") as r:
                data = orjson.loads(await r.read())
            if any(b["name"] == name and b["healthy"] is healthy for b in data["backends"]):
                return
            await asyncio.sleep(0.05)


async def _metric(client: aiohttp.ClientSession, gw: str, sample: str) -> float:
    async with client.get(gw + "/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith(sample + " "):
                return float(line.split()[-1])
    return 0.0
