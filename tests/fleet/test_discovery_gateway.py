"""A real gateway discovering real sim engines through a real DNS server on loopback, under a steady
session workload: a replica added to the DNS answer joins, takes its share of new sessions and
moves at most 1/N of the old ones (with image affinity, a session stays where its images are held:
none needs to move), and only to itself; a replica removed takes only its own sessions away; no
request fails. The engines listen on 127.0.0.2-4 with one port, as pods of a headless Service do."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from mmgate.sim.config import SimSettings
from mmgate.sim.server import start_sim
from tests.fleet.dns import Records, loopback_dns
from tests.fleet.workload import MODEL, Service, SessionWorkload
from tests.support.gateway import gateway_settings, running_gateway
from tests.support.ports import free_port

NAME = "vllm.fleet.test"
ADDRESSES = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
SESSIONS = 90


@pytest.fixture
async def engines() -> AsyncIterator[int]:
    """Three sim engines on 127.0.0.2-4, one port; yields the port."""
    port = free_port()
    servers = [await start_sim(SimSettings(host=a, port=port, speedup=1000.0)) for a in ADDRESSES]
    try:
        yield port
    finally:
        for server in servers:
            await server.stop()


async def homes(workload: SessionWorkload, prefix: str = "p") -> dict[str, str]:
    """Each probe session's backend now: one turn each, one after the other."""
    found = {}
    for i in range(SESSIONS):
        outcome = await workload.turn(f"{prefix}{i}")
        assert outcome is not None and outcome.status == 200, outcome
        found[f"{prefix}{i}"] = outcome.backend
    return found


async def until_serving(gateway: object, names: set[str]) -> None:
    router = gateway.router  # type: ignore[attr-defined]
    for _ in range(200):
        if {b.name for b in router.candidates(MODEL)} == names:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the gateway never served {names}: {[b.name for b in router.backends]}")


async def test_replicas_join_and_leave_through_dns_moving_only_their_sessions(engines: int) -> None:
    port = engines
    records: Records
    with loopback_dns() as (records, server):
        records.set(NAME, ADDRESSES[:2])
        settings = gateway_settings(backend_dns=(f"vllm=http://{NAME}:{port}",), backend_dns_server=server,
                                    backend_dns_interval_s=0.2, backend_dns_allowed=("127.0.0.0/8",))
        async with running_gateway(settings) as gw:
            a, b, c = (f"{address}:{port}" for address in ADDRESSES)
            await until_serving(gw.gateway, {a, b})
            service = Service([gw.url])
            load = SessionWorkload(service, sessions=12, concurrency=2)
            probe = SessionWorkload(service, sessions=SESSIONS, concurrency=1)
            running = asyncio.create_task(load.run())
            try:
                before = await homes(probe)
                assert set(before.values()) == {a, b}

                records.set(NAME, ADDRESSES)  # a replica joins
                await until_serving(gw.gateway, {a, b, c})
                joined = await homes(probe)
                moved = [s for s in before if joined[s] != before[s]]
                assert all(joined[s] == c for s in moved)  # only to the new replica
                assert len(moved) <= SESSIONS / 3
                fresh = await homes(probe, "q")  # new sessions: the new replica wins its share
                assert SESSIONS / 6 <= sum(home == c for home in fresh.values()) <= SESSIONS / 2

                records.set(NAME, [ADDRESSES[1], ADDRESSES[2]])  # a replica leaves
                await until_serving(gw.gateway, {b, c})
                left = await homes(probe)
                moved = [s for s in joined if left[s] != joined[s]]
                assert moved and sorted(moved) == sorted(s for s in joined if joined[s] == a)  # its own only
            finally:
                load.stop.set()
                await running
                await probe.close()
            assert load.outcomes and load.failures() == []
            assert probe.failures() == []
