"""UUID reuse made safe, end to end with real sim engines (vLLM stand-ins: vLLM cannot run here)
on loopback: session affinity, failover with healing, tenant isolation, gateway-managed strip, and
a sliding window over an engine cache too small for it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp

from mmgate.sim.config import SimSettings
from tests.support.gateway import gateway_settings, running_gateway, running_sims, vllm_specs
from tests.support.http import post
from tests.support.images import png_data_url
from tests.support.recorder import recording_proxy

MODEL = "mmgate-sim-vl"


def turn(parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "go"}, *parts]}]}


def img(url: str | None, uuid: str | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "image_url", "image_url": {"url": url} if url else None}
    if uuid:
        part["uuid"] = uuid
    return part


def reuse_counts(headers: dict[str, str]) -> dict[str, int]:
    items = (kv.split("=") for kv in headers["x-mmgate-reuse"].split("; "))
    return {k: int(v) for k, v in items}


async def test_session_sticks_then_fails_over_and_heals_cache_only_references() -> None:
    async with running_sims(3) as sims:
        settings = gateway_settings(backends=vllm_specs(sims), health_interval_s=0.2)
        async with running_gateway(settings) as gw:
            h = {"x-session-id": "agent-7"}
            status, _, headers = await post(gw.url, turn([img(png_data_url(1), "shot-1")]), h)
            assert status == 200
            home = headers["x-mmgate-backend"]
            for _ in range(19):
                status, _, headers = await post(gw.url, turn([img(None, "shot-1")]), h)
                assert status == 200 and headers["x-mmgate-backend"] == home
            by_name = {f"sim-{i}": s for i, s in enumerate(sims)}
            await by_name[home].stop()
            status, body, headers = await post(gw.url, turn([img(None, "shot-1")]), h)
            assert status == 200, body
            assert headers["x-mmgate-backend"] != home
            assert reuse_counts(headers)["healed"] == 1
            new_home = by_name[headers["x-mmgate-backend"]]
            assert new_home.stats.images_processed == 1  # the healed image, processed once
            # The next turn on the new home needs no heal: the image is in its cache now.
            status, _, headers = await post(gw.url, turn([img(None, "shot-1")]), h)
            assert status == 200 and reuse_counts(headers)["healed"] == 0


async def test_tenant_cannot_reference_another_tenants_uuid(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("key-a tenant-a\nkey-b tenant-b\n")
    async with running_sims(1) as sims, recording_proxy(sims[0].url) as rec:
        settings = gateway_settings(backends=vllm_specs([rec]), api_keys_file=str(keys))
        async with running_gateway(settings) as gw:
            a = {"Authorization": "Bearer key-a"}
            b = {"Authorization": "Bearer key-b"}
            assert (await post(gw.url, turn([img(png_data_url(2), "shared-name")]), a))[0] == 200
            key_a = rec.image_parts()[0]["uuid"]
            assert key_a.endswith("/shared-name") and key_a != "shared-name"
            assert (await post(gw.url, turn([img(None, "shared-name")]), a))[0] == 200
            status, body, _ = await post(gw.url, turn([img(None, "shared-name")]), b)
            assert status == 400
            assert "shared-name" in body["error"]["message"]
            assert rec.image_parts()[0]["uuid"] not in (key_a, "shared-name")
            assert rec.image_parts()[0]["image_url"] is None  # B never received A's bytes


async def test_missing_or_wrong_key_is_401_and_nothing_is_loaded(tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text('{"key-a": "tenant-a"}')
    async with running_gateway(gateway_settings(api_keys_file=str(keys))) as gw:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic key-a"}):
            status, body, _ = await post(gw.url, turn([img(png_data_url(3))]), headers)
            assert status == 401 and body["error"]["type"] == "authentication_error"
        assert len(gw.gateway.loader.local) == 0
        status, _, _ = await post(gw.url, turn([img(png_data_url(3))]), {"Authorization": "Bearer key-a"})
        assert status == 200


async def test_auto_reuse_strips_repeats_without_uuids() -> None:
    async with running_sims(1) as sims, recording_proxy(sims[0].url) as rec:
        async with running_gateway(gateway_settings(backends=vllm_specs([rec]))) as gw:
            one, two = png_data_url(4), png_data_url(5)
            _, _, h1 = await post(gw.url, turn([img(one)]))
            _, _, h2 = await post(gw.url, turn([img(one), img(two)]))
            assert reuse_counts(h1) == {"sent": 1, "stripped": 0, "referenced": 0, "healed": 0}
            assert reuse_counts(h2) == {"sent": 1, "stripped": 1, "referenced": 0, "healed": 0}
            first, second = rec.image_parts()
            assert first["image_url"] is None and first["uuid"].startswith("~sha256:")
            assert second["image_url"]["url"] == two
            assert sims[0].stats.images_processed == 2 and sims[0].stats.cache_hits == 1


async def test_reuse_off_sends_every_image() -> None:
    async with running_sims(1) as sims, recording_proxy(sims[0].url) as rec:
        async with running_gateway(gateway_settings(backends=vllm_specs([rec]), reuse="off")) as gw:
            for _ in range(3):
                _, _, headers = await post(gw.url, turn([img(png_data_url(6))]))
                assert reuse_counts(headers)["stripped"] == 0
            assert all(p["image_url"] is not None for b in range(3) for p in rec.image_parts(b))


async def test_sliding_window_over_a_too_small_engine_cache_has_no_client_errors() -> None:
    # Each 224x224 image is ~0.6 MB processed; a 1 MiB engine cache holds 1 of a window of 4.
    tiny = SimSettings(port=0, speedup=1000.0, mm_processor_cache_gb=1 / 1024)
    async with running_sims(1, tiny) as sims:
        settings = gateway_settings(backends=vllm_specs(sims), reuse_backend_cache_gb=4.0)
        async with running_gateway(settings) as gw:
            healed = 0
            for t in range(12):
                window = [img(png_data_url(100 + i, 224), f"w{i}") for i in range(max(0, t - 3), t + 1)]
                status, body, headers = await post(gw.url, turn(window), {"x-session-id": "win"})
                assert status == 200, body
                healed += reuse_counts(headers)["healed"]
            assert healed > 0  # the gateway believed the engine held what it had evicted
            assert sims[0].stats.cache_evictions > 0


async def test_another_gateway_heals_from_the_shared_uuid_store(standalone_server: Any) -> None:
    # Two gateways share a real Redis; each has its own engine. The uuid arrives with its image
    # at gateway 1; a cache-only reference to it at gateway 2 misses on gateway 2's engine and is
    # healed with the bytes gateway 1 put in the shared uuid store.
    cache = {"redis_url": standalone_server.url}
    async with running_sims(2) as sims:
        one = gateway_settings(backends=vllm_specs(sims[:1]), cache=cache)
        two = gateway_settings(backends=vllm_specs(sims[1:]), cache=cache)
        async with running_gateway(one) as gw1, running_gateway(two) as gw2:
            status, _, _ = await post(gw1.url, turn([img(png_data_url(7), "shared-shot")]))
            assert status == 200
            for _ in range(100):  # the shared write runs in the background: wait for it (bounded)
                if len(standalone_server.client().keys("*:v")) >= 2:  # the image entry + the uuid entry
                    break
                await asyncio.sleep(0.02)
            status, body, headers = await post(gw2.url, turn([img(None, "shared-shot")]))
            assert status == 200, body
            assert reuse_counts(headers)["healed"] == 1
            assert sims[1].stats.images_processed == 1


async def test_streaming_request_heals_before_the_first_byte() -> None:
    # The engine answers a cache miss with a 400 before any stream starts, so a streamed turn
    # heals exactly like a non-streamed one and the client sees only a normal SSE stream.
    async with running_sims(2) as sims:
        async with running_gateway(gateway_settings(backends=vllm_specs(sims))) as gw:
            h = {"x-session-id": "stream-heal"}
            status, _, headers = await post(gw.url, turn([img(png_data_url(8), "st-1")]), h)
            assert status == 200
            home = headers["x-mmgate-backend"]
            await {f"sim-{i}": s for i, s in enumerate(sims)}[home].stop()
            async with aiohttp.ClientSession() as s, s.post(
                gw.url + "/v1/chat/completions", json={**turn([img(None, "st-1")]), "stream": True}, headers=h
            ) as r:
                raw = await r.read()
                assert r.status == 200
                assert reuse_counts(dict(r.headers))["healed"] == 1
            frames = [f for f in raw.split(b"\n\n") if f]
            assert frames[-1] == b"data: [DONE]"
            assert all(b'"error"' not in f for f in frames)


async def test_session_scoping_keeps_sessions_apart_and_bypasses_without_one() -> None:
    settings = gateway_settings(cache={"session_scoping": True})
    async with running_gateway(settings) as gw:
        url = png_data_url(9)
        loads = gw.gateway.loader.metrics.image_loads
        for sid in ("a", "a", "b"):
            status, _, _ = await post(gw.url, turn([img(url)]), {"x-session-id": sid})
            assert status == 200
        assert loads.labels(outcome="local_hit")._value.get() == 1  # a's repeat only; b is apart
        for _ in range(2):
            assert (await post(gw.url, turn([img(url)])))[0] == 200
        assert loads.labels(outcome="local_hit")._value.get() == 1  # no session id: no cache at all
        assert loads.labels(outcome="origin")._value.get() == 4


async def test_failover_does_not_wait_for_ejection() -> None:
    # With ejection only after 3 failures, the first request after the home backend dies must
    # still go to the next backend in the router's order, not fail with a 502.
    async with running_sims(2) as sims:
        settings = gateway_settings(backends=vllm_specs(sims), eject_after_failures=3, health_interval_s=60)
        async with running_gateway(settings) as gw:
            h = {"x-session-id": "slow-eject"}
            status, _, headers = await post(gw.url, turn([img(png_data_url(10), "fo-1")]), h)
            assert status == 200
            home = headers["x-mmgate-backend"]
            await {f"sim-{i}": s for i, s in enumerate(sims)}[home].stop()
            status, body, headers = await post(gw.url, turn([img(None, "fo-1")]), h)
            assert status == 200, body
            assert headers["x-mmgate-backend"] != home
            assert reuse_counts(headers)["healed"] == 1
