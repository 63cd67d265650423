"""The faults a fleet must ride out, each run while a ``SessionWorkload`` keeps going, each returning
what the clients saw in its window: requests, failures (and why), healed cache misses, latency, and
for the DNS changes the sessions that moved. Shared by ``tests/fleet/test_fleet_faults.py`` (quick,
sim engines) and ``benchmarks/regression/fleet_faults.py``.

The Service is emulated as Kubernetes runs it: a gateway leaves the endpoints before it gets
SIGTERM (``preStop``) and rejoins once ``/health`` answers; a SIGKILLed gateway leaves the endpoints
at once (its readiness would fail within a probe period; requests sent to it meanwhile would be
refused connections, which this emulation does not count).
"""

from __future__ import annotations

import asyncio
import signal
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.fleet.harness import Child, Fleet
from tests.fleet.workload import Outcome, SessionWorkload

PRESTOP_S = 0.5  # the endpoints update before SIGTERM (the manifests' preStop sleep, scaled down)


@dataclass
class PhaseResult:
    """What the clients saw while one fault ran."""

    name: str
    seconds: float
    requests: int
    failed: int
    healed: int
    p50_ms: float
    p99_ms: float
    errors: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        return {"phase": self.name, "seconds": round(self.seconds, 1), "requests": self.requests,
                "failed": self.failed, "healed": self.healed, "p50_ms": round(self.p50_ms, 1),
                "p99_ms": round(self.p99_ms, 1), **self.extra, "errors": self.errors[:5]}


def summarise(name: str, outcomes: Sequence[Outcome], seconds: float, **extra: Any) -> PhaseResult:
    ok = sorted((o.ended - o.started) * 1000 for o in outcomes if o.status == 200)
    failed = [o for o in outcomes if o.status != 200]
    p99 = ok[min(len(ok) - 1, int(len(ok) * 0.99))] if ok else 0.0
    return PhaseResult(name, seconds, len(outcomes), len(failed), sum(o.healed for o in outcomes),
                       statistics.median(ok) if ok else 0.0, p99,
                       [f"{o.gateway} {o.status} {o.error[:160]}" for o in failed], dict(extra))


async def steady(workload: SessionWorkload, seconds: float, name: str = "steady") -> PhaseResult:
    started = time.monotonic()
    await asyncio.sleep(seconds)
    return summarise(name, workload.between(started, time.monotonic()), time.monotonic() - started)


async def _replace(gateway: Child, workload: SessionWorkload, stop: str) -> int | None:
    """Take a gateway out of the Service, stop it (SIGTERM and its drain, or SIGKILL), start it again
    on its port and put it back."""
    service = workload.service
    code: int | None
    if stop == "term":
        service.remove(gateway.url)
        await asyncio.sleep(PRESTOP_S)
        code = await asyncio.to_thread(gateway.stop, 30.0)
    else:
        gateway.kill()  # on the loop: nothing the clients do runs between the count and the kill
        service.remove(gateway.url)
        code = -signal.SIGKILL
    for _ in range(200):  # the requests it was answering see their connections end
        if workload.in_flight[gateway.url] == 0:
            break
        await asyncio.sleep(0.05)
    await workload.forget(gateway.url)  # a new client pool for the new process (as for a new pod)
    await asyncio.to_thread(gateway.start)
    service.add(gateway.url)
    return code


async def rolling_restart(fleet: Fleet, workload: SessionWorkload, settle_s: float) -> PhaseResult:
    """(a) Each gateway in turn: out of the Service, SIGTERM (it drains), restarted, back in."""
    started = time.monotonic()
    codes = []
    for gateway in fleet.gateways:
        codes.append(await _replace(gateway, workload, "term"))
        await asyncio.sleep(settle_s)
    return summarise("rolling restart (SIGTERM each)", workload.between(started, time.monotonic()),
                     time.monotonic() - started, exit_codes=codes)


async def sigkill(fleet: Fleet, workload: SessionWorkload, settle_s: float, index: int = 0,
                  streams: int = 4, stream_tokens: int = 4000) -> PhaseResult:
    """(b) One gateway SIGKILLed while ``streams`` long answers run through it: the requests in
    flight on it are lost (none other may be); it restarts and rejoins."""
    gateway = fleet.gateways[index]
    started = time.monotonic()
    answering = [asyncio.Event() for _ in range(streams)]
    long = [asyncio.create_task(workload.long_stream(gateway.url, f"long{i}", stream_tokens, event))
            for i, event in enumerate(answering)]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in answering)), 30)
    in_flight = workload.in_flight[gateway.url]
    still_streaming = sum(not task.done() for task in long)  # a loaded machine may finish one early
    killed_at = time.monotonic()
    await _replace(gateway, workload, "kill")
    await asyncio.gather(*long)
    await asyncio.sleep(settle_s)
    outcomes = workload.between(started, time.monotonic())
    lost = [o for o in outcomes if o.status != 200 and o.gateway == gateway.url and o.started <= killed_at]
    return summarise("SIGKILL one gateway", outcomes, time.monotonic() - started,
                     in_flight_at_kill=in_flight, long_streams=still_streaming, failed_in_flight=len(lost))


def _homes(outcomes: Sequence[Outcome], *, last: bool) -> dict[str, str]:
    homes: dict[str, str] = {}
    for o in sorted(outcomes, key=lambda o: o.started, reverse=last):
        if o.status == 200 and o.session not in homes:
            homes[o.session] = o.backend
    return homes


async def dns_change(fleet: Fleet, workload: SessionWorkload, addresses: Sequence[str], name: str,
                     observe_s: float) -> PhaseResult:
    """(c) The headless Service's answer changes to ``addresses``: every gateway follows; which
    sessions moved (their last backend before vs their first after), and whether any moved that
    did not have to (a session moves only to a new replica, or off a removed one)."""
    started = time.monotonic()
    before = _homes(workload.between(0, started), last=True)
    old = {b for b in before.values()}
    fleet.publish(addresses)
    converged_s = await asyncio.to_thread(fleet.wait_backends, len(addresses))
    changed = time.monotonic()
    await asyncio.sleep(observe_s)
    after = _homes(workload.between(changed, time.monotonic()), last=False)
    new = fleet.backend_names(addresses)
    both = [s for s in before if s in after]
    moved = [s for s in both if before[s] != after[s]]
    needless = [s for s in moved if before[s] in new and after[s] in old]  # moved between replicas that stayed
    return summarise(name, workload.between(started, time.monotonic()), time.monotonic() - started,
                     converged_s=round(converged_s, 2), sessions=len(both), moved=len(moved),
                     moved_needlessly=len(needless), backends=len(new))


async def redis_node_kill(fleet: Fleet, workload: SessionWorkload, down_s: float, settle_s: float) -> PhaseResult:
    """(d) One Redis master stopped for ``down_s`` and started again (its data gone: a cache)."""
    node = fleet.redis.nodes[1]
    started = time.monotonic()
    await asyncio.to_thread(node.stop)
    await asyncio.sleep(down_s)
    await asyncio.to_thread(node.start)
    await asyncio.to_thread(fleet.redis.wait_ready)
    await asyncio.sleep(settle_s)
    return summarise("Redis node killed and restarted", workload.between(started, time.monotonic()),
                     time.monotonic() - started)
