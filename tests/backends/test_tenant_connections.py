"""Each tenant's share of a backend's connections, through a real gateway with API keys in front of
a real sim engine (slow enough that a stream lasts): one tenant's clients open streams and never
read them; another tenant is still served, at once, and the first tenant's excess gets a 429 that
names the limit. The share's arithmetic is tested on its own too."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import orjson
import pytest

from mmgate.backends.tenant_share import ConnectionShares, tenant_share
from mmgate.errors import TenantConnectionsError
from mmgate.sim.config import SimSettings
from tests.support.gateway import gateway_settings, running_gateway, running_sims, vllm_specs
from tests.support.http import CHAT_PATH

# 5 ms a token: a stream of 4000 tokens lasts ~20 s, longer than the test.
SLOW_SIM = SimSettings(port=0, speedup=2.0)
LONG_STREAM = {"model": "mmgate-sim-vl", "stream": True, "max_tokens": 4000, "ignore_eos": True,
               "messages": [{"role": "user", "content": "tell me everything"}]}
SHORT = {"model": "mmgate-sim-vl", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def test_a_tenant_holds_at_most_half_of_a_backends_connections() -> None:
    assert [tenant_share(n) for n in (1, 2, 3, 4, 1024)] == [1, 1, 2, 2, 512]
    shares = ConnectionShares("vllm-0", 3)
    assert shares.take(None)() is None  # no API keys: no tenant, nothing counted
    first, _ = shares.take("a"), shares.take("a")
    with pytest.raises(TenantConnectionsError, match="--backend-max-connections") as refused:
        shares.take("a")
    assert refused.value.status == 429 and refused.value.code == "tenant_backend_connections"
    shares.take("b")  # the other half stays for the others
    first()
    first()  # given back once, whatever the caller does
    assert shares.held("a") == 1
    shares.take("a")
    assert shares.held("a") == 2


async def unread_stream(port: int, key: str) -> asyncio.StreamWriter:
    """A client that asks for a long stream and never reads a byte of it."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    body = orjson.dumps(LONG_STREAM)
    writer.write(f"POST {CHAT_PATH} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    return writer


async def test_unread_streams_of_one_tenant_leave_the_others_served(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("key-attacker tenant-a\nkey-victim tenant-b\n")
    async with running_sims(1, SLOW_SIM) as sims:
        settings = gateway_settings(backends=vllm_specs(sims), api_keys_file=str(keys), backend_max_connections=3,
                                    backend_connect_timeout_s=10.0)
        async with running_gateway(settings) as gw, aiohttp.ClientSession() as session:
            backend = gw.gateway.router.backends[0]
            held = [await unread_stream(gw.port, "key-attacker") for _ in range(3)]  # every connection, if let
            try:
                for _ in range(100):
                    if backend.shares.held("tenant-a") >= 2:  # type: ignore[attr-defined]
                        break
                    await asyncio.sleep(0.05)
                started = time.monotonic()
                async with session.post(gw.url + CHAT_PATH, json=SHORT,
                                        headers={"Authorization": "Bearer key-victim"}) as r:
                    assert r.status == 200, await r.text()
                assert time.monotonic() - started < 5
                async with session.post(gw.url + CHAT_PATH, json=LONG_STREAM,
                                        headers={"Authorization": "Bearer key-attacker"}) as r:
                    assert r.status == 429
                    error = (await r.json())["error"]
                assert error["code"] == "tenant_backend_connections" and "--backend-max-connections" in error["message"]
                assert r.headers["Retry-After"] == "1"
            finally:
                for writer in held:
                    writer.close()
            for _ in range(100):  # the client went away: its connections come back
                if backend.shares.held("tenant-a") == 0:  # type: ignore[attr-defined]
                    break
                await asyncio.sleep(0.05)
            assert backend.shares.held("tenant-a") == 0  # type: ignore[attr-defined]
