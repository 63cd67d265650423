"""``Router.set_backends`` against real sim engines on loopback: backends that stay keep their
health, load and holdings; new ones join healthy and empty and are learnt by a background refresh;
removed ones are forgotten at once while their requests in flight finish, and the router closes
them after; rendezvous moves only what must move."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import orjson
import pytest
from prometheus_client import CollectorRegistry

from mmgate.backends.http import HTTPBackend
from mmgate.config import GatewaySettings
from mmgate.metrics import GatewayMetrics
from mmgate.routing.router import Router
from mmgate.routing.sync.peers import Routed
from mmgate.routing.weights import RoutedImage
from mmgate.sim.config import SimSettings
from mmgate.sim.server import SimServer, start_sim

FAST = SimSettings(port=0, speedup=1000.0)
MODEL = FAST.model


class Watched(HTTPBackend):
    """A real HTTP backend that remembers being closed (the router owns its lifecycle)."""

    closes = 0

    async def close(self) -> None:
        self.closes += 1
        await super().close()


def backend(name: str, sim: SimServer) -> Watched:
    return Watched(name, "vllm", sim.url, connect_timeout_s=1.0, read_timeout_s=5.0)


@asynccontextmanager
async def sims(count: int, settings: SimSettings = FAST) -> AsyncIterator[list[SimServer]]:
    servers = [await start_sim(settings) for _ in range(count)]
    try:
        yield servers
    finally:
        for s in servers:
            await s.stop()


async def eventually(condition: Callable[[], bool], *, within_s: float = 10.0) -> None:
    """Wait for ``condition`` (a bound on waiting, not a speed assertion)."""
    async with asyncio.timeout(within_s):
        while not condition():
            await asyncio.sleep(0.01)


def homes(router: Router, keys: list[str]) -> dict[str, str]:
    return {k: router.ranked(MODEL, k)[0].name for k in keys}


async def test_a_joining_backend_is_learnt_in_the_background_and_takes_only_its_share() -> None:
    registry = CollectorRegistry()
    async with sims(3) as servers:
        b0, b1, b2 = (backend(f"sim-{i}", s) for i, s in enumerate(servers))
        router = Router([b0, b1], GatewaySettings(eject_after_failures=2), metrics=GatewayMetrics(registry))
        try:
            await router.refresh_models()
            router.begin(b0, [RoutedImage("img-a", 100.0)])
            router.holdings.hold("sim-0", [("img-a", 1000)])
            router.report_failure(b1)  # one failure of the two that eject
            sessions = [f"session-{i}" for i in range(300)]
            before = homes(router, sessions)

            router.set_backends([b0, b1, b2])
            # Those that stay keep their load, health and holdings; the new one is healthy and empty.
            assert router.outstanding(b0) == 1
            assert router.holdings.holds("sim-0", "img-a")
            assert router.is_healthy(b2) and router.holdings.num_held("sim-2") == 0
            assert registry.get_sample_value("mmgate_backend_healthy", {"backend": "sim-2"}) == 1.0
            # Its models come from a refresh the router started itself, not from the request path.
            await eventually(lambda: b2 in router.candidates(MODEL))
            after = homes(router, sessions)
            moved = {k for k in sessions if before[k] != after[k]}
            assert moved and all(after[k] == "sim-2" for k in moved)
            assert len(moved) < len(sessions) / 2
            router.report_failure(b1)  # its first failure was kept: this second one ejects it
            assert not router.is_healthy(b1)
            router.end(b0)
            assert router.outstanding(b0) == 0
            assert b0.closes == b1.closes == b2.closes == 0
        finally:
            await router.close()
        assert b0.closes == b1.closes == b2.closes == 1


async def test_a_leaving_backend_is_forgotten_at_once_and_closed_once_its_stream_ends() -> None:
    registry = CollectorRegistry()
    slow = FAST.model_copy(update={"speedup": 20.0})  # 0.5 ms a token: a 200-token stream is in flight a while
    async with sims(3, slow) as servers:
        b0, b1, b2 = (backend(f"sim-{i}", s) for i, s in enumerate(servers))
        metrics = GatewayMetrics(registry)
        router = Router([b0, b1, b2], GatewaySettings(), metrics=metrics)
        try:
            await router.refresh_models()
            for name in ("sim-0", "sim-2"):  # counted series of a backend that stays and of one that leaves
                metrics.backend_ok(name)
                metrics.backend_requests.labels(name, "http_500").inc()
                metrics.backend_ejections.labels(name).inc()
            sessions = [f"session-{i}" for i in range(300)]
            before = homes(router, sessions)
            router.holdings.hold("sim-2", [("img-b", 1000)])
            body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                 "max_tokens": 200, "stream": True, "ignore_eos": True})
            router.begin(b2)
            reply = await b2.chat(body, stream=True)
            assert reply.status == 200 and reply.stream is not None

            router.set_backends([b0, b1])
            assert router.backends == [b0, b1]
            assert b2 not in router.candidates(MODEL)
            assert not router.is_healthy(b2) and router.outstanding(b2) == 0
            assert not router.holdings.holds("sim-2", "img-b")
            router._apply_routed(Routed("sim-2", -1, ("img-c",)))  # another gateway's news of it: dropped
            assert router.holdings.num_held("sim-2") == 0 and not router.holdings.knows("img-c")
            assert registry.get_sample_value("mmgate_backend_healthy", {"backend": "sim-2"}) is None
            for outcome in ("ok", "http_500"):  # its counters go too: labels do not grow with churn
                requests = {"backend": "sim-2", "outcome": outcome}
                assert registry.get_sample_value("mmgate_backend_requests_total", requests) is None
                assert registry.get_sample_value("mmgate_backend_requests_total", {**requests, "backend": "sim-0"}) == 1.0
            assert registry.get_sample_value("mmgate_backend_ejections_total", {"backend": "sim-2"}) is None
            assert registry.get_sample_value("mmgate_backend_ejections_total", {"backend": "sim-0"}) == 1.0
            after = homes(router, sessions)
            assert all(after[k] == before[k] for k in sessions if before[k] != "sim-2")
            assert all(after[k] != "sim-2" for k in sessions)
            router.report_failure(b2)  # the gateway's report for a backend that left: ignored
            await asyncio.sleep(0.05)
            assert b2.closes == 0  # its stream is still in flight

            chunks = [chunk async for chunk in reply.stream]
            reply.release()
            router.end(b2)
            assert b"[DONE]" in b"".join(chunks)
            await eventually(lambda: b2.closes == 1)
            assert router.outstanding(b0) == router.outstanding(b1) == 0
        finally:
            await router.close()
        assert b2.closes == 1  # closed once, by the router, not again on close()


async def test_a_backend_given_again_as_another_object_keeps_its_state_and_the_old_one_closes() -> None:
    async with sims(2) as servers:
        b0, b1 = (backend(f"sim-{i}", s) for i, s in enumerate(servers))
        router = Router([b0, b1], GatewaySettings(eject_after_failures=1))
        try:
            await router.refresh_models()
            router.begin(b1)
            router.report_failure(b0)
            router.holdings.hold("sim-1", [("img-c", 1000)])
            b1_again = backend("sim-1", servers[1])
            router.set_backends([b0, b1_again])
            assert router.backends[1] is b1_again
            assert router.candidates(MODEL)[1] is b1_again
            assert router.outstanding(b1_again) == 1  # the old object's request still counts for sim-1
            assert router.holdings.holds("sim-1", "img-c") and not router.is_healthy(b0)
            router.end(b1)
            assert router.outstanding(b1_again) == 0
            await eventually(lambda: b1.closes == 1)
            assert b1_again.closes == 0
        finally:
            await router.close()


async def test_a_replaced_object_closed_at_the_drain_timeout_leaves_no_load_behind() -> None:
    async with sims(2) as servers:
        b0, b1 = (backend(f"sim-{i}", s) for i, s in enumerate(servers))
        router = Router([b0, b1], GatewaySettings(drain_timeout_s=0.05))
        try:
            router.begin(b1)  # a request that outlives the drain timeout
            b1_again = backend("sim-1", servers[1])
            router.set_backends([b0, b1_again])
            assert router.outstanding(b1_again) == 1
            await eventually(lambda: b1.closes == 1)  # closed with the request in flight
            assert router.outstanding(b1_again) == 0  # its count went with it...
            router.end(b1)
            router.begin(b1_again)
            router.end(b1_again)
            assert router.outstanding(b1_again) == 0  # ...and its late end takes nothing from sim-1
        finally:
            await router.close()


async def test_set_backends_refuses_an_empty_or_ambiguous_fleet() -> None:
    async with sims(1) as servers:
        b0 = backend("sim-0", servers[0])
        router = Router([b0], GatewaySettings())
        try:
            with pytest.raises(ValueError, match="at least one"):
                router.set_backends([])
            with pytest.raises(ValueError, match="unique"):
                router.set_backends([b0, backend("sim-0", servers[0])])
            assert router.backends == [b0]
        finally:
            await router.close()
