"""Requests in flight per tenant, through a real gateway with API keys: a tenant at
``--max-tenant-requests`` gets 429 with Retry-After for its next request, another tenant is served
meanwhile, and the slot comes back when a stream ends. The pure counter too."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from mmgate.api.tenant_slots import TenantSlots
from mmgate.errors import TenantLimitError
from mmgate.sim.config import SimSettings
from tests.support.gateway import gateway_settings, running_gateway


def test_slots_count_per_tenant_and_leave_no_entry_behind() -> None:
    slots = TenantSlots(2)
    with slots.hold("a"), slots.hold("a"):
        with pytest.raises(TenantLimitError) as err:
            with slots.hold("a"):
                pass
        assert err.value.status == 429 and err.value.retry_after_s == 1
        with slots.hold("b"):
            assert (slots.in_flight("a"), slots.in_flight("b")) == (2, 1)
    assert slots._in_flight == {}
    with TenantSlots(0).hold("a"), TenantSlots(0).hold("a"):
        pass  # 0: no limit


async def test_a_tenant_at_its_limit_gets_429_and_others_are_served(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("key-a tenant-a\nkey-b tenant-b\n")
    slow = SimSettings(port=0, speedup=1.0, decode_ms_per_token=50.0)
    settings = gateway_settings(api_keys_file=str(keys), max_tenant_requests=2)
    body = {"model": "mmgate-sim-vl", "stream": True, "max_tokens": 40, "ignore_eos": True,
            "messages": [{"role": "user", "content": "go"}]}
    async with running_gateway(settings, sim=slow) as gw, aiohttp.ClientSession() as s:
        a, b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
        streams = [await s.post(gw.url + "/v1/chat/completions", json=body, headers=a) for _ in range(2)]
        try:
            assert [r.status for r in streams] == [200, 200]
            async with s.post(gw.url + "/v1/completions", json={"prompt": "x"}, headers=a) as r:
                answer = await r.json()
                assert r.status == 429 and answer["error"]["code"] == "tenant_request_limit"
                assert r.headers["Retry-After"] == "1"
            async with s.post(gw.url + "/v1/chat/completions", headers=b, json={
                    "model": "mmgate-sim-vl", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}) as r:
                assert r.status == 200  # another tenant is not held back
            async with s.get(gw.url + "/health") as r:
                assert r.status == 200  # probes are outside the limit
        finally:
            for r in streams:
                await r.read()
                r.release()
        await asyncio.sleep(0.05)
        async with s.post(gw.url + "/v1/chat/completions", headers=a, json={
                "model": "mmgate-sim-vl", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}) as r:
            assert r.status == 200  # the streams' slots came back
