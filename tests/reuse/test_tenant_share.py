"""Tenant A's flood of uuids leaves tenant B's usable, end to end: a real gateway with a small
uuid store in front of a real sim engine (vLLM's stand-in: vLLM cannot serve this many requests
here in time) whose processor cache holds one image, so every old reference is an engine miss
the gateway must heal from its uuid store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmgate.sim.config import SimSettings
from tests.reuse.test_reuse_e2e import img, reuse_counts, turn
from tests.support.gateway import gateway_settings, running_gateway, running_sims, vllm_specs
from tests.support.http import post
from tests.support.images import png_data_url

A = {"Authorization": "Bearer key-a"}
B = {"Authorization": "Bearer key-b"}


async def test_one_tenants_uuid_flood_leaves_the_others_uuids_usable(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("key-a tenant-a\nkey-b tenant-b\n")
    tiny = SimSettings(port=0, speedup=1000.0, mm_processor_cache_gb=1 / 1024)
    async with running_sims(1, tiny) as sims:
        # ~2 KB an entry: the store holds about 12 images, A sends 60.
        settings = gateway_settings(backends=vllm_specs(sims), api_keys_file=str(keys), uuid_store_bytes=24_000)
        async with running_gateway(settings) as gw:
            store = gw.gateway.store
            for i in range(2):
                status, body, _ = await post(gw.url, turn([img(png_data_url(500 + i, 224), f"b{i}")]), B)
                assert status == 200, body
            for i in range(60):
                status, body, _ = await post(gw.url, turn([img(png_data_url(600 + i, 224), f"a{i}")]), A)
                assert status == 200, body
                assert store.num_cached_bytes <= 24_000
            results: list[tuple[int, Any, dict[str, str]]] = [
                await post(gw.url, turn([img(None, f"b{i}")]), B) for i in range(2)]
            evicted_a = await post(gw.url, turn([img(None, "a0")]), A)
            latest_a = await post(gw.url, turn([img(None, "a59")]), A)
    for status, body, headers in results:  # B's references: the engine evicted them, the store healed them
        assert status == 200, body
        assert reuse_counts(headers)["healed"] == 1
    assert evicted_a[0] == 400 and "a0" in evicted_a[1]["error"]["message"]  # A's flood evicted A's own
    assert latest_a[0] == 200
    assert sims[0].stats.cache_evictions > 0
