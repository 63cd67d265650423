"""The router against real sim engines on loopback: affinity, ejection on a really stopped backend
(by a failed request and by a probe), re-admission by the probe loop after a restart on the same
port, and the model union."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import orjson
import pytest
from prometheus_client import CollectorRegistry

from mmgate.backends.base import Backend
from mmgate.backends.http import HTTPBackend
from mmgate.config import GatewaySettings
from mmgate.errors import BackendConnectError
from mmgate.metrics import GatewayMetrics
from mmgate.routing.router import Router
from mmgate.sim.config import SimSettings
from mmgate.sim.server import SimServer, start_sim

FAST = SimSettings(port=0, speedup=1000.0)
MODEL = FAST.model
SESSION = "agent-run-42"


def backend(name: str, sim: SimServer) -> HTTPBackend:
    return HTTPBackend(name, "vllm", sim.url, connect_timeout_s=1.0, read_timeout_s=5.0)


@asynccontextmanager
async def sims_and_router(
    count: int = 2, metrics: GatewayMetrics | None = None, **values: object
) -> AsyncIterator[tuple[list[SimServer], Router]]:
    """Sims and a router built from the shipped settings, ``values`` changed."""
    sims = [await start_sim(FAST) for _ in range(count)]
    router = Router([backend(f"sim-{i}", s) for i, s in enumerate(sims)], GatewaySettings(**values),  # type: ignore[arg-type]
                    metrics=metrics)
    try:
        await router.refresh_models()
        yield sims, router
    finally:
        await router.close()
        for s in sims:
            await s.stop()


async def eventually(condition: Callable[[], bool], *, within_s: float = 10.0) -> None:
    """Wait for ``condition`` (a bound on waiting, not a speed assertion)."""
    async with asyncio.timeout(within_s):
        while not condition():
            await asyncio.sleep(0.01)


async def chat(router: Router, b: HTTPBackend) -> int:
    body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    router.begin(b)
    try:
        reply = await b.chat(body, stream=False)
    finally:
        router.end(b)
    return reply.status


async def test_session_sticks_then_moves_on_a_failed_request() -> None:
    async with sims_and_router(2) as (sims, router):
        picks = {router.ranked(MODEL, SESSION)[0] for _ in range(20)}
        assert len(picks) == 1
        home = picks.pop()
        assert isinstance(home, HTTPBackend)
        assert await chat(router, home) == 200
        other = next(b for b in router.backends if b is not home)
        await sims[router.backends.index(home)].stop()
        with pytest.raises(BackendConnectError):
            await chat(router, home)
        router.report_failure(home)
        assert router.outstanding(home) == 0
        moved = router.ranked(MODEL, SESSION)[0]
        assert moved is other
        assert await chat(router, other) == 200  # type: ignore[arg-type]


async def test_probe_ejects_a_stopped_backend_and_the_loop_readmits_it_after_restart() -> None:
    registry = CollectorRegistry()
    async with sims_and_router(2, GatewayMetrics(registry), health_interval_s=0.05, readmit_after_s=0.0) as (
            sims, router):
        home = router.ranked(MODEL, SESSION)[0]
        index = router.backends.index(home)
        port = sims[index].port
        await sims[index].stop()
        await router.probe_once()
        assert not router.is_healthy(home)
        assert registry.get_sample_value("mmgate_backend_healthy", {"backend": home.name}) == 0.0
        assert router.ranked(MODEL, SESSION)[0] is not home
        # Back on the same port: the background probe loop must notice and re-admit it.
        sims[index] = await start_sim(FAST.model_copy(update={"port": port}))
        await router.start()
        await eventually(lambda: router.is_healthy(home))
        assert registry.get_sample_value("mmgate_backend_healthy", {"backend": home.name}) == 1.0
        assert router.ranked(MODEL, SESSION)[0] is home
        assert await chat(router, home) == 200  # type: ignore[arg-type]


async def test_probe_loop_ejects_without_any_traffic_and_stops_on_close() -> None:
    async with sims_and_router(2, health_interval_s=0.05) as (sims, router):
        await router.start()
        await sims[1].stop()
        await eventually(lambda: not router.is_healthy(router.backends[1]))
        assert router.is_healthy(router.backends[0])
        await router.stop()
        await router.stop()  # idempotent


async def test_all_stopped_fails_open_to_the_session_backend() -> None:
    async with sims_and_router(2) as (sims, router):
        home = router.ranked(MODEL, SESSION)[0]
        for s in sims:
            await s.stop()
        await router.probe_once()
        assert not any(router.is_healthy(b) for b in router.backends)
        assert router.ranked(MODEL, SESSION)[0] is home


async def test_models_aggregates_backends_serving_different_models() -> None:
    sims = [await start_sim(FAST.model_copy(update={"model": m})) for m in ("vl-small", "vl-large")]
    router = Router([backend(f"sim-{i}", s) for i, s in enumerate(sims)], GatewaySettings())
    try:
        await router.refresh_models()
        assert router.models == ["vl-large", "vl-small"]
        assert {router.ranked("vl-large", f"s{i}")[0].name for i in range(20)} == {"sim-1"}
        assert {router.ranked("vl-small", None)[0].name for _ in range(20)} == {"sim-0"}
        await sims[1].stop()
        await router.probe_once()  # unreachable: keeps its last model list, and is ejected
        assert router.models == ["vl-large", "vl-small"]
        assert router.ranked("vl-large", "s")[0] is router.backends[1]  # fail-open: its only server
    finally:
        await router.close()
        for s in sims:
            await s.stop()


async def test_in_flight_requests_spread_by_least_outstanding() -> None:
    async with sims_and_router(2) as (_, router):
        body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})

        async def send(b: Backend) -> int:
            try:
                return (await b.chat(body, stream=False)).status
            finally:
                router.end(b)

        picked: list[str] = []
        tasks = []
        for _ in range(8):
            b = router.ranked(MODEL, None)[0]
            router.begin(b)  # counted at the pick, as the gateway does, so the next pick sees it
            picked.append(b.name)
            tasks.append(asyncio.create_task(send(b)))
        assert sorted(picked) == ["sim-0"] * 4 + ["sim-1"] * 4
        assert await asyncio.gather(*tasks) == [200] * 8
        assert all(router.outstanding(b) == 0 for b in router.backends)


