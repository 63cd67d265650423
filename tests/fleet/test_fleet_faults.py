"""The fleet under faults, quick variant: 3 real gateway processes, sim engines found through a real
DNS server, a real 3-master Redis Cluster, a steady multi-session image workload with uuid references
spread over the gateways as a Service would, while (a) each gateway in turn gets SIGTERM and is
restarted, (b) one gets SIGKILL, (c) a replica is added and one removed through DNS, (d) a Redis node
is killed and restarted. ``benchmarks/regression/fleet_faults.py`` runs the same phases longer and reports them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.fleet import faults
from tests.fleet.harness import running_fleet
from tests.fleet.workload import Service, SessionWorkload
from tests.support.redis_servers import require_redis_server

require_redis_server()

A, B, C = "127.0.0.2", "127.0.0.3", "127.0.0.4"


@pytest.mark.timeout(300)
async def test_the_fleet_rides_out_restarts_kills_dns_changes_and_a_redis_node(tmp_path: Path) -> None:
    # Engines at 1/20 of the sim's modelled latency: a request is in flight long enough to be cut.
    fleet_cm = running_fleet(tmp_path, addresses=(A, B), spare=(C,), speedup=20.0)
    fleet = await asyncio.to_thread(fleet_cm.__enter__)
    try:
        workload = SessionWorkload(Service([g.url for g in fleet.gateways]), sessions=24, concurrency=6)
        running = asyncio.create_task(workload.run())
        try:
            warm = await faults.steady(workload, 2.0, "warm-up")
            rolling = await faults.rolling_restart(fleet, workload, settle_s=0.5)
            kill = await faults.sigkill(fleet, workload, settle_s=0.5)
            add = await faults.dns_change(fleet, workload, (A, B, C), "replica added (DNS)", observe_s=2.0)
            remove = await faults.dns_change(fleet, workload, (B, C), "replica removed (DNS)", observe_s=2.0)
            redis = await faults.redis_node_kill(fleet, workload, down_s=1.5, settle_s=1.0)
        finally:
            workload.stop.set()
            await running
    finally:
        await asyncio.to_thread(fleet_cm.__exit__, None, None, None)
    for phase in (warm, rolling, kill, add, remove, redis):
        print(phase.row())
    assert warm.requests > 0 and warm.failed == 0, warm.errors
    assert rolling.failed == 0 and rolling.extra["exit_codes"] == [0, 0, 0], rolling.errors
    # the streams still running at the kill really were cut
    assert kill.extra["long_streams"] > 0 and kill.extra["failed_in_flight"] >= kill.extra["long_streams"]
    assert kill.failed == kill.extra["failed_in_flight"] <= kill.extra["in_flight_at_kill"], kill.errors
    assert add.failed == 0 and add.extra["moved_needlessly"] == 0, add.errors
    assert add.extra["moved"] <= add.extra["sessions"] / 3
    assert remove.failed == 0 and remove.extra["moved_needlessly"] == 0 and remove.extra["moved"] > 0, remove.errors
    assert redis.failed == 0, redis.errors
