"""A tenant's flood of new images cannot flush another tenant's out of a backend's processor cache:
a real gateway with two tenants in front of a real sim engine (vLLM's stand-in) whose processor
cache holds ten 224x224 images, sized as the gateway is told (``--reuse-backend-cache-gb``). The
flood is really sent, four requests at a time."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from mmgate.sim.config import SimSettings
from tests.reuse.test_reuse_e2e import img, reuse_counts, turn
from tests.support.gateway import RunningGateway, gateway_settings, running_gateway, running_sims, vllm_specs
from tests.support.http import Reply, post
from tests.support.images import png_data_url

A = {"Authorization": "Bearer key-a"}  # the flooder
B = {"Authorization": "Bearer key-b"}  # the victim
ENTRY_BYTES = 602_112  # what the sim's processor cache holds of a 224x224 image
CACHE_GB = 10 * ENTRY_BYTES / 1024**3
FLOOD = 32


async def flood(url: str, session: aiohttp.ClientSession) -> list[Reply]:
    """Tenant A sends ``FLOOD`` requests of a new labelled 224x224 image each, four at a time."""
    replies: list[Reply] = []
    for start in range(0, FLOOD, 4):
        replies += await asyncio.gather(*(
            post(url, turn([img(png_data_url(700 + i, 224), f"a{i}")]), A, session=session)
            for i in range(start, start + 4)))
    return replies


@contextlib.asynccontextmanager
async def two_tenants(tmp_path: Path) -> AsyncIterator[tuple[RunningGateway, aiohttp.ClientSession, Any]]:
    """A gateway with tenants A and B in front of one sim; yields (gateway, session, sim stats)."""
    keys = tmp_path / "keys.txt"
    keys.write_text("key-a tenant-a\nkey-b tenant-b\n")
    sim = SimSettings(port=0, speedup=1000.0, mm_processor_cache_gb=CACHE_GB)
    async with running_sims(1, sim) as sims:
        settings = gateway_settings(backends=vllm_specs(sims), api_keys_file=str(keys), reuse_backend_cache_gb=CACHE_GB)
        async with running_gateway(settings) as gw, aiohttp.ClientSession() as session:
            yield gw, session, sims[0].stats


async def run(tmp_path: Path, *, victim_active: bool) -> tuple[list[Reply], list[Reply], object, float | None]:
    async with two_tenants(tmp_path) as (gw, session, stats):
        victim: list[Reply] = []
        if victim_active:
            for i in range(2):
                victim.append(await post(gw.url, turn([img(png_data_url(500 + i, 224), f"b{i}")]), B, session=session))
        flooded = await flood(gw.url, session)
        if victim_active:  # B's references, then a new image of B's
            victim += [await post(gw.url, turn([img(None, f"b{i}")]), B, session=session) for i in range(2)]
            victim.append(await post(gw.url, turn([img(png_data_url(510, 224), "b-new")]), B, session=session))
        refusals = gw.gateway.metrics.registry.get_sample_value("mmgate_cache_share_refusals_total")
        return victim, flooded, stats, refusals


async def test_a_flood_past_its_share_gets_429s_and_the_victims_images_stay_held(tmp_path: Path) -> None:
    victim, flooded, stats, refusals = await run(tmp_path, victim_active=True)
    for i, (status, body, _) in enumerate(victim):
        assert status == 200, (i, body["error"]["message"] if body else body)
    for _, _, headers in victim[2:4]:  # its references: stripped, found in the engine's cache
        assert reuse_counts(headers)["healed"] == 0
    served = [r for r in flooded if r.status == 200]
    refused = [r for r in flooded if r.status != 200]
    # A is served while the modelled cache has room (its estimate of an image is 0.2 % above the
    # sim's: nine fit, B holds two), then refused: past its share, the oldest image is B's.
    assert len(served) == 7 and len(refused) == FLOOD - 7
    for status, body, headers in refused:
        assert status == 429
        assert body["error"]["code"] == "tenant_cache_share" and body["error"]["type"] == "rate_limit_error"
        assert "share" in body["error"]["message"] and "127.0.0.1" not in body["error"]["message"]
        assert 1 <= int(headers["Retry-After"]) <= 60
    assert stats.cache_evictions == 0  # type: ignore[attr-defined]
    assert refusals == FLOOD - 7


async def test_a_tenant_alone_is_never_limited(tmp_path: Path) -> None:
    _, flooded, stats, refusals = await run(tmp_path, victim_active=False)
    assert [r.status for r in flooded] == [200] * FLOOD
    assert stats.cache_evictions > 0  # type: ignore[attr-defined]
    assert refusals == 0


async def test_without_tenants_nothing_changes() -> None:
    sim = SimSettings(port=0, speedup=1000.0, mm_processor_cache_gb=CACHE_GB)
    async with running_sims(1, sim) as sims:
        # A client's uuid may spell a tenant tag without API keys: still one client pool, no share.
        tag = "t" + "0" * 32
        settings = gateway_settings(backends=vllm_specs(sims), reuse_backend_cache_gb=CACHE_GB)
        async with running_gateway(settings) as gw:
            await post(gw.url, turn([img(png_data_url(1, 224), f"{tag}/x")]))
            for i in range(12):
                status, body, _ = await post(gw.url, turn([img(png_data_url(800 + i, 224), f"t{i:032x}/{i}")]))
                assert status == 200, body


async def test_images_larger_than_the_cache_are_not_counted(tmp_path: Path) -> None:
    async with two_tenants(tmp_path) as (gw, session, _):
        for i in range(2):  # B holds two images: within its share
            assert (await post(gw.url, turn([img(png_data_url(900 + i, 224), f"b{i}")]), B, session=session))[0] == 200
        # A's images of 1400x1400 (~23 MB processed each, past the 6 MB cache) evict nothing:
        # vLLM keeps no image larger than its cache. Four at once, none refused.
        replies = await asyncio.gather(*(
            post(gw.url, turn([img(png_data_url(950 + i, 1400), f"big{i}")]), A, session=session) for i in range(4)))
        assert [r.status for r in replies] == [200] * 4
