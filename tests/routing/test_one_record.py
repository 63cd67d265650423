"""The router and the reuse sender read one record of what each backend holds, against a real
gateway and real sim engines on loopback: after a heal, an ejection and re-admission, and a
failover (before a request and in the middle of a stream) the backend the router prefers for a
held image is the one the sender strips it for, and nothing is healed that the record could know.

``agree`` fails if the two ever disagree about an image; each test also checks what the engines
did (a cache-only reference that missed is a heal; an image sent again is processed again)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import aiohttp
import orjson

from mmgate.api.gateway import Gateway
from mmgate.reuse import CONTENT_PREFIX
from mmgate.serve import RunningGateway
from mmgate.sim.config import SimSettings
from mmgate.sim.server import SimServer, start_sim
from tests.support.gateway import FAST_SIM, gateway_settings, running_gateway, vllm_specs
from tests.support.images import make_image

MODEL = FAST_SIM.model


def data_url(seed: int) -> str:
    return "data:image/png;base64," + base64.b64encode(make_image("PNG", 56, 56, seed=seed)).decode()


def key_of(url: str) -> str:
    """The backend key the gateway gives the image: its content hash (no tenant)."""
    return CONTENT_PREFIX + hashlib.sha256(base64.b64decode(url.split(",", 1)[1])).hexdigest()


def body(images: list[str], *, stream: bool = False, max_tokens: int = 2) -> bytes:
    parts = [{"type": "text", "text": "look"}] + [{"type": "image_url", "image_url": {"url": u}} for u in images]
    return orjson.dumps({"model": MODEL, "max_tokens": max_tokens, "stream": stream, "ignore_eos": True,
                         "messages": [{"role": "user", "content": parts}]})


def agree(gateway: Gateway, key: str) -> list[str]:
    """The backends holding ``key`` — the same for the router's policy and the sender — by name."""
    names = [b.name for b in gateway.router.backends]
    router = [n for n in names if gateway.router.policy.holdings.holds(n, key)]
    sender = [n for n in names if gateway.reuse.holdings.holds(n, key)]
    assert router == sender, (router, sender)
    return router


async def chat(client: aiohttp.ClientSession, gw: RunningGateway, images: list[str]) -> tuple[str, str]:
    """The backend that answered and what reuse did (``x-mmgate-reuse``)."""
    async with client.post(gw.url + "/v1/chat/completions", data=body(images),
                           headers={"Content-Type": "application/json"}) as r:
        assert r.status == 200, await r.text()
        await r.read()
        return r.headers["x-mmgate-backend"], r.headers["x-mmgate-reuse"]


async def eventually(condition: Callable[[], bool], within_s: float = 10.0) -> None:
    async with asyncio.timeout(within_s):
        while not condition():
            await asyncio.sleep(0.02)


def heals(gateway: Gateway) -> float:
    return gateway.metrics.reuse_heals._value.get()  # type: ignore[attr-defined,no-any-return]


@asynccontextmanager
async def fleet(sim: SimSettings = FAST_SIM, **values: object) -> AsyncIterator[tuple[list[SimServer], RunningGateway]]:
    """Two sims behind one gateway of the shipped routing (health and re-admission fast)."""
    sims = [await start_sim(sim.model_copy(update={"port": 0})) for _ in range(2)]
    settings = gateway_settings(backends=vllm_specs(sims), **{"readmit_after_s": 0.0, **values})
    try:
        async with running_gateway(settings) as gw:
            yield sims, gw
    finally:
        for s in sims:
            await s.stop()


async def restart(sims: list[SimServer], name: str) -> None:
    """Stop the sim named ``name`` and start a fresh one (an empty cache) on its port."""
    index = int(name.rsplit("-", 1)[1])
    port = sims[index].port
    await sims[index].stop()
    sims[index] = await start_sim(FAST_SIM.model_copy(update={"port": port}))


async def test_a_heal_forgets_the_image_for_both_and_it_is_held_again_once_answered() -> None:
    async with fleet(health_interval_s=3600.0) as (sims, gw), aiohttp.ClientSession() as client:
        gateway, image = gw.gateway, data_url(1)
        assert gateway.reuse.holdings is gateway.router.holdings
        first, reuse = await chat(client, gw, [image])
        assert reuse.startswith("sent=1; stripped=0")
        key = key_of(image)
        assert agree(gateway, key) == [first]
        await restart(sims, first)  # same port, empty cache; no probe notices (an hour between)
        again, reuse = await chat(client, gw, [image])
        # The router sent it to the holder, the sender stripped it, the engine missed: healed.
        assert again == first and reuse == "sent=1; stripped=0; referenced=0; healed=1"
        assert agree(gateway, key) == [first]  # forgotten on the miss, held again after the 200
        third, reuse = await chat(client, gw, [image])
        assert third == first and reuse.startswith("sent=0; stripped=1") and heals(gateway) == 1


async def test_a_readmitted_backend_holds_nothing_for_either() -> None:
    async with fleet(health_interval_s=0.05) as (sims, gw), aiohttp.ClientSession() as client:
        gateway = gw.gateway
        images = [data_url(10 + i) for i in range(6)]
        placed = {u: (await chat(client, gw, [u]))[0] for u in images}
        keys = {u: key_of(u) for u in images}
        victim = placed[images[0]]
        router = gateway.router
        backend = next(b for b in router.backends if b.name == victim)
        await restart(sims, victim)
        # The probe loop sees it answer again only after an ejection: force one, as a failed
        # request would, then wait for the re-admission.
        router.report_failure(backend)
        await eventually(lambda: router.is_healthy(backend))
        for u in images:
            assert victim not in agree(gateway, keys[u])
        for u in images:
            where, reuse = await chat(client, gw, [u])
            # Nothing believed held on the restarted backend: sent with data there, no heal.
            assert reuse.startswith("sent=1") if where == victim else reuse.startswith("sent=0; stripped=1"), (
                where, reuse)
        assert heals(gateway) == 0


async def test_a_failover_records_only_the_backend_that_answered() -> None:
    async with fleet(health_interval_s=3600.0) as (sims, gw), aiohttp.ClientSession() as client:
        gateway = gw.gateway
        image = data_url(20)
        home, _ = await chat(client, gw, [image])
        key = key_of(image)
        index = int(home.rsplit("-", 1)[1])
        await sims[index].stop()  # the holder is gone: the next request's connect fails there
        other, reuse = await chat(client, gw, [image])
        assert other != home and reuse.startswith("sent=1; stripped=0")  # data to where it is not held
        assert set(agree(gateway, key)) == {home, other}  # the failed attempt recorded nothing new
        fresh = data_url(21)
        where, _ = await chat(client, gw, [fresh])
        assert agree(gateway, key_of(fresh)) == [where] == [other]
        assert heals(gateway) == 0


async def test_a_stream_cut_by_its_backend_then_a_failover_and_a_readmission() -> None:
    slow = SimSettings(port=0, speedup=1.0, decode_ms_per_token=20.0)
    async with fleet(slow, health_interval_s=0.05) as (sims, gw), aiohttp.ClientSession() as client:
        gateway, router = gw.gateway, gw.gateway.router
        image = data_url(30)
        async with client.post(gw.url + "/v1/chat/completions", data=body([image], stream=True, max_tokens=500),
                               headers={"Content-Type": "application/json"}) as r:
            assert r.status == 200
            await r.content.readuntil(b"\n\n")  # streaming: the backend answered
            streamer = r.headers["x-mmgate-backend"]
            key = key_of(image)
            assert agree(gateway, key) == [streamer]
            index = int(streamer.rsplit("-", 1)[1])
            port = sims[index].port
            await sims[index].stop()  # cut in the middle of the stream
            await r.read()
        backend = next(b for b in router.backends if b.name == streamer)
        await eventually(lambda: not router.is_healthy(backend))
        other, reuse = await chat(client, gw, [image])
        assert other != streamer and reuse.startswith("sent=1; stripped=0")
        sims[index] = await start_sim(slow.model_copy(update={"port": port}))
        await eventually(lambda: router.is_healthy(backend))
        assert agree(gateway, key) == [other]  # the restarted one holds nothing, for both
        again, reuse = await chat(client, gw, [image])
        assert again == other and reuse.startswith("sent=0; stripped=1") and heals(gateway) == 0
