"""Discovery takes only what an operator allowed, with a real gateway resolving through a real DNS
server on loopback in front of real sim engines on 127.0.0.2-3 (one port, as pods of a headless
Service): special-purpose addresses in an answer never become backends unless opened; an answer
flooded with records cannot push the replicas that serve out of the bounded set; an answer that
flaps between replicas fails no request."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest

from mmgate.fleet.dns_admission import admitted
from mmgate.sim.config import SimSettings
from mmgate.sim.server import start_sim
from tests.fleet.dns import Records, loopback_dns
from tests.fleet.test_discovery_gateway import until_serving
from tests.fleet.workload import MODEL
from tests.support.gateway import gateway_settings, running_gateway
from tests.support.http import CHAT_PATH
from tests.support.ports import free_port

NAME = "vllm.fleet.test"
REPLICAS = ["127.0.0.2", "127.0.0.3"]
# What a poisoned zone or a spoofed answer could name besides the replicas.
SPECIAL = ["169.254.169.254", "100.100.100.200", "0.0.0.0", "127.0.0.1", "::1", "224.0.0.1",
           "255.255.255.255", "fe80::1", "ff02::1", "::ffff:169.254.169.254", "240.0.0.1"]
BODY = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def replicas() -> AsyncIterator[int]:
    """Two sim engines on 127.0.0.2-3, one port; yields the port."""
    port = free_port()
    servers = [await start_sim(SimSettings(host=a, port=port, speedup=1000.0)) for a in REPLICAS]
    try:
        yield port
    finally:
        for server in servers:
            await server.stop()


async def until_resolved(records: Records, rounds: int = 3) -> None:
    """``rounds`` more resolutions (A and AAAA each) have reached the DNS server."""
    target = records.queries + 2 * rounds
    for _ in range(400):
        if records.queries >= target:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the gateway stopped resolving")


async def statuses(url: str, count: int) -> list[int]:
    async with aiohttp.ClientSession() as session:
        found = []
        for _ in range(count):
            async with session.post(url + CHAT_PATH, json=BODY) as r:
                await r.read()
                found.append(r.status)
        return found


def test_special_purpose_addresses_are_refused_and_metadata_is_never_opened() -> None:
    every = ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")
    kept, refused = admitted([*SPECIAL, "10.1.2.3", "fd00::5", "100.64.0.7", "192.168.1.9"], ())
    assert kept == ["10.1.2.3", "fd00::5", "100.64.0.7", "192.168.1.9"]  # private: what pods have
    assert set(refused) == set(SPECIAL)
    kept, refused = admitted(SPECIAL, every)  # opening everything opens no metadata endpoint
    assert set(refused) == {"169.254.169.254", "100.100.100.200", "::ffff:169.254.169.254"}


async def test_an_answer_naming_special_purpose_addresses_adds_only_the_opened_replica(replicas: int) -> None:
    with loopback_dns() as (records, server):
        records.set(NAME, [*SPECIAL, REPLICAS[0]])
        settings = gateway_settings(backend_dns=(f"vllm=http://{NAME}:{replicas}",), backend_dns_server=server,
                                    backend_dns_interval_s=0.2, backend_dns_allowed=(f"{REPLICAS[0]}/32",))
        async with running_gateway(settings) as gw:
            router = gw.gateway.router
            assert [b.name for b in router.backends] == [f"{REPLICAS[0]}:{replicas}"]
            records.set(NAME, SPECIAL)  # nothing allowed left: fail static, the replica stays
            await until_resolved(records)
            assert [b.name for b in router.backends] == [f"{REPLICAS[0]}:{replicas}"]
            assert set(await statuses(gw.url, 5)) == {200}


async def test_a_flooded_answer_cannot_push_out_the_replicas_that_serve(replicas: int) -> None:
    # Private addresses no replica has, numbered before the replicas: the order an answer is cut in.
    flood = [f"10.0.{i // 250}.{i % 250 + 1}" for i in range(398)]
    with loopback_dns() as (records, server):
        records.set(NAME, REPLICAS)
        settings = gateway_settings(backend_dns=(f"vllm=http://{NAME}:{replicas}",), backend_dns_server=server,
                                    backend_dns_interval_s=0.2, backend_dns_allowed=("127.0.0.0/8",))
        async with running_gateway(settings) as gw:
            serving = {f"{a}:{replicas}" for a in REPLICAS}
            await until_serving(gw.gateway, serving)
            records.set(NAME, [*flood, *REPLICAS])
            await until_resolved(records)
            names = {b.name for b in gw.gateway.router.backends}
            assert len(names) == settings.max_backends and serving <= names
            assert set(await statuses(gw.url, 10)) == {200}


async def test_an_answer_flapping_between_replicas_fails_no_request(replicas: int) -> None:
    with loopback_dns() as (records, server):
        records.set(NAME, REPLICAS[:1])
        settings = gateway_settings(backend_dns=(f"vllm=http://{NAME}:{replicas}",), backend_dns_server=server,
                                    backend_dns_interval_s=0.1, backend_dns_allowed=("127.0.0.0/8",))
        async with running_gateway(settings) as gw, aiohttp.ClientSession() as session:
            await until_serving(gw.gateway, {f"{REPLICAS[0]}:{replicas}"})
            stop = asyncio.Event()
            seen: list[tuple[int, str]] = []

            async def client() -> None:
                while not stop.is_set():
                    async with session.post(gw.url + CHAT_PATH, json=BODY) as r:
                        seen.append((r.status, (await r.read()).decode(errors="replace")[:200]))

            async def flap() -> None:
                flips = 0
                while not stop.is_set():
                    await asyncio.sleep(0.3)
                    flips += 1
                    records.set(NAME, [REPLICAS[flips % 2]])

            tasks = [asyncio.create_task(client()) for _ in range(4)] + [asyncio.create_task(flap())]
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            stop.set()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait_for(task, 30)
            assert len(seen) > 200
            assert [s for s in seen if s[0] != 200] == []
