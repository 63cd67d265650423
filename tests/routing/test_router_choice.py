"""Router decisions (candidates, affinity, P2C, fail-open, accounting, metrics) without sockets.

``StaticBackend`` is an in-memory stand-in whose only job is to have a name and a model list: these
tests check choices, not I/O. Every I/O path (probes, refresh, stop and restart) is exercised
against real sim engines in ``test_router_sims.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time

import pytest
from prometheus_client import CollectorRegistry

from mmgate.backends.base import BackendKind, BackendReply
from mmgate.config import GatewaySettings
from mmgate.errors import BackendConnectError, ModelNotFoundError
from mmgate.metrics import GatewayMetrics
from mmgate.routing import router as router_module
from mmgate.routing.router import Router, build_router
from mmgate.routing.scheduling.rendezvous import rendezvous_rank

MODEL = "m"


class StaticBackend:
    """Name + model list + a health answer; ``chat`` is never called here."""

    kind: BackendKind = "vllm"

    def __init__(self, name: str, models: list[str] | None = None, *, up: bool = True) -> None:
        self.name = name
        self.url = f"http://{name}.invalid"
        self.served = models if models is not None else [MODEL]
        self.up = up

    async def chat(self, body: bytes, *, stream: bool) -> BackendReply:
        raise AssertionError("not used")

    async def models(self) -> list[str]:
        if not self.up:
            raise BackendConnectError(f"{self.name} down")
        return self.served

    async def healthy(self) -> bool:
        return self.up

    async def load(self, timeout_s: float) -> int | None:
        return None

    async def close(self) -> None:
        return None


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def make(
    count: int = 3, clock: Clock | None = None, **values: object
) -> tuple[Router, list[StaticBackend]]:
    """A router built as the gateway builds it: the shipped settings, with ``values`` changed."""
    backends = [StaticBackend(f"b{i}") for i in range(count)]
    router = Router(backends, GatewaySettings(**values), rng=random.Random(7),  # type: ignore[arg-type]
                    clock=clock or time.monotonic)
    await router.refresh_models()
    return router, backends


async def test_session_sticks_and_moves_only_when_its_backend_is_ejected() -> None:
    router, backends = await make(3, readmit_after_s=0.0)
    sessions = [f"s{i}" for i in range(300)]
    before = {s: router.ranked(MODEL, s)[0].name for s in sessions}
    assert len(set(before.values())) == 3
    router.report_failure(backends[1])
    after = {s: router.ranked(MODEL, s)[0].name for s in sessions}
    assert all(after[s] != "b1" for s in sessions)
    assert {s for s in sessions if after[s] != before[s]} == {s for s in sessions if before[s] == "b1"}
    router.report_success(backends[1])
    assert {s: router.ranked(MODEL, s)[0].name for s in sessions} == before


async def test_without_session_least_outstanding_of_two() -> None:
    router, backends = await make(2)
    router.begin(backends[0])
    assert {router.ranked(MODEL, None)[0].name for _ in range(50)} == {"b1"}
    router.begin(backends[1])
    router.begin(backends[1])
    assert {router.ranked(MODEL, None)[0].name for _ in range(50)} == {"b0"}
    router.end(backends[1])
    router.end(backends[1])
    router.end(backends[1])  # one too many: clamps at zero
    assert router.outstanding(backends[1]) == 0


async def test_ejected_backends_get_no_traffic_without_session() -> None:
    router, backends = await make(3)
    router.report_failure(backends[0])
    assert "b0" not in {router.ranked(MODEL, None)[0].name for _ in range(100)}


async def test_all_ejected_fails_open_with_the_same_affinity() -> None:
    router, backends = await make(3)
    sessions = [f"s{i}" for i in range(100)]
    before = {s: router.ranked(MODEL, s)[0].name for s in sessions}
    for b in backends:
        router.report_failure(b)
    assert not any(router.is_healthy(b) for b in router.backends)
    assert {s: router.ranked(MODEL, s)[0].name for s in sessions} == before
    assert router.ranked(MODEL, None)[0] in backends


async def test_ranked_healthy_first_by_rendezvous_then_ejected() -> None:
    router, backends = await make(4)
    router.report_failure(backends[2])
    healthy = ["b0", "b1", "b3"]
    for s in ("a", "b", "c", None):
        order = [b.name for b in router.ranked(MODEL, s)]
        assert sorted(order) == ["b0", "b1", "b2", "b3"]
        assert order[-1] == "b2"
        if s is not None:
            assert order[:3] == [healthy[i] for i in rendezvous_rank(s, healthy)]


async def test_readmission_waits_for_the_minimum_time_out() -> None:
    clock = Clock()
    router, backends = await make(2, readmit_after_s=5.0, clock=clock)
    router.report_failure(backends[0])
    clock.now = 4.0
    router.report_success(backends[0])
    assert not router.is_healthy(backends[0])
    clock.now = 5.0
    router.report_success(backends[0])
    assert router.is_healthy(backends[0])


async def test_models_union_and_per_model_candidates() -> None:
    a, b = StaticBackend("a", ["m1"]), StaticBackend("b", ["m2", "m1"])
    router = Router([a, b], GatewaySettings())  # type: ignore[list-item]
    await router.refresh_models()
    assert router.models == ["m1", "m2"]
    assert {router.ranked("m2", f"s{i}")[0].name for i in range(30)} == {"b"}
    with pytest.raises(ModelNotFoundError) as info:
        router.ranked("nope", "s")[0]
    assert info.value.status == 404


async def test_unreachable_backend_keeps_its_last_model_list() -> None:
    a, b = StaticBackend("a", ["m1"]), StaticBackend("b", ["m2"])
    router = Router([a, b], GatewaySettings())  # type: ignore[list-item]
    await router.refresh_models()
    b.up = False
    await router.refresh_models()
    assert router.models == ["m1", "m2"]


async def test_no_backend_ever_answered_routes_anyway() -> None:
    a = StaticBackend("a", up=False)
    router = Router([a], GatewaySettings())  # type: ignore[list-item]
    await router.refresh_models()
    assert router.ranked("anything", None)[0] is a


async def test_probe_round_ejects_and_readmits() -> None:
    router, backends = await make(2, readmit_after_s=0.0)
    backends[0].up = False
    await router.probe_once()
    assert not router.is_healthy(backends[0])
    backends[0].up = True
    await router.probe_once()
    assert router.is_healthy(backends[0])


async def test_metrics_health_outstanding_ejections() -> None:
    registry = CollectorRegistry()
    backends = [StaticBackend("b0"), StaticBackend("b1")]
    router = Router(backends, GatewaySettings(readmit_after_s=0.0), metrics=GatewayMetrics(registry))  # type: ignore[arg-type]

    def value(name: str, backend: str) -> float | None:
        return registry.get_sample_value(name, {"backend": backend})

    assert value("mmgate_backend_healthy", "b0") == 1.0
    router.report_failure(backends[0])
    assert value("mmgate_backend_healthy", "b0") == 0.0
    assert value("mmgate_backend_ejections_total", "b0") == 1.0
    router.report_success(backends[0])
    assert value("mmgate_backend_healthy", "b0") == 1.0
    router.begin(backends[1])
    assert value("mmgate_backend_outstanding", "b1") == 1.0
    router.end(backends[1])
    assert value("mmgate_backend_outstanding", "b1") == 0.0


def test_from_settings_and_bad_arguments() -> None:
    settings = GatewaySettings(eject_after_failures=3, readmit_after_s=3600.0, health_interval_s=0.5)
    a = StaticBackend("a")
    router = build_router([a], settings)
    router.report_failure(a)
    router.report_failure(a)
    assert router.is_healthy(a)
    router.report_failure(a)
    assert not router.is_healthy(a)
    router.report_success(a)  # an hour has not passed
    assert not router.is_healthy(a)
    assert router.policy.mode == "image-affinity" and router.policy.load_factor == settings.routing.load_factor
    session = GatewaySettings.model_validate({"routing": {"mode": "session", "load_factor": 2.0}})
    assert (build_router([a], session).policy.mode, build_router([a], session).policy.load_factor) == ("session", 2.0)
    with pytest.raises(ValueError):
        Router([], settings)
    with pytest.raises(ValueError):
        Router([StaticBackend("a"), StaticBackend("a")], settings)


async def test_routing_metrics_by_reason_and_image_weight_hit_ratio() -> None:
    from mmgate.routing.weights import RoutedImage

    registry = CollectorRegistry()
    backends = [StaticBackend(f"b{i}") for i in range(3)]
    router = Router(backends, GatewaySettings(readmit_after_s=0.0), metrics=GatewayMetrics(registry))  # type: ignore[arg-type]
    await router.refresh_models()
    images = [RoutedImage("content:abc", 256.0), RoutedImage("content:def", 100.0)]
    first = router.ranked(MODEL, None, images)[0]
    router.begin(first, images)
    router.holdings.hold(first.name, [("content:abc", 1000), ("content:def", 1000)])  # it answered
    router.record_answered(first, images, "a-session-id")
    router.end(first)
    router.begin(first, images[:1])
    router.end(first)
    router.ranked(MODEL, None, [])
    router.ranked(MODEL, "a-session-id", [RoutedImage("content:new", 10.0)])

    def sample(name: str, labels: dict[str, str]) -> float | None:
        return registry.get_sample_value(name, labels)

    assert sample("mmgate_routing_decisions_total", {"reason": "image_affinity"}) == 1
    assert sample("mmgate_routing_decisions_total", {"reason": "least_loaded"}) == 1
    assert sample("mmgate_routing_decisions_total", {"reason": "session"}) == 1
    assert sample("mmgate_routing_image_weight_total", {"backend": first.name, "outcome": "miss"}) == 356
    assert sample("mmgate_routing_image_weight_total", {"backend": first.name, "outcome": "hit"}) == 256
    # Bounded labels only: no image key, no session id anywhere in the exposition.
    from prometheus_client import generate_latest

    text = generate_latest(registry).decode()
    assert "abc" not in text and "a-session-id" not in text
    # A re-admitted backend is believed empty again.
    router.report_failure(first)
    router.report_success(first)
    assert router.holdings.holders("content:abc") == []
    assert router.holdings.knows("content:abc")  # who showed it is about the clients: kept


class WillNotStop:
    """A background task that ignores its cancellation, as the routing sync's did when redis-py lost
    one (tests/routing/test_sync.py has the sync itself); ``release`` ends it."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def run(self) -> None:
        while not self.release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await self.release.wait()


async def test_stop_is_bounded_when_a_background_task_will_not_stop(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(router_module, "STOP_WAIT_S", 0.3)
    router = Router([StaticBackend("a")], GatewaySettings(health_interval_s=3600.0))  # type: ignore[list-item]
    stuck = WillNotStop()
    router.sync = stuck  # type: ignore[assignment]
    await router.start()
    task = next(t for t in asyncio.all_tasks() if t.get_name() == "mmgate-router-sync")
    await asyncio.sleep(0.01)  # it runs, and waits
    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="mmgate.app_runtime"):
        await router.stop()  # the shutdown goes on: the gateway is not held by one stuck task
    assert 0.25 < time.monotonic() - started < 2.0
    assert any("mmgate-router-sync did not stop" in r.getMessage() for r in caplog.records)
    stuck.release.set()
    await asyncio.wait([task], timeout=2)
    assert task.done()


async def test_an_image_in_flight_for_one_session_is_shared_for_the_next_before_any_answer() -> None:
    """Who showed an image is recorded as the request is routed: another session's request with
    the same image, while the first is still in flight, goes to the image's home under the load
    cap, not to its own session's home as if the image were its own new one."""
    from mmgate.routing.weights import RoutedImage

    backends = [StaticBackend(f"b{i}") for i in range(4)]
    router = Router(backends, GatewaySettings())  # type: ignore[arg-type]
    await router.refresh_models()
    names = [b.name for b in backends]
    image = RoutedImage("content:in-flight", 256.0)
    home = names[rendezvous_rank(image.key, names)[0]]
    # A second session whose own home is not the image's home.
    other = next(s for s in (f"session-{i}" for i in range(100)) if names[rendezvous_rank(s, names)[0]] != home)
    first = router.ranked(MODEL, "session-first", [image])[0]
    router.begin(first, [image])  # in flight: no backend has answered, none holds it
    assert router.holdings.holders(image.key) == []
    decision = router.policy.decide(names, [0] * 4, other, [image])
    assert (names[decision.order[0]], decision.reason) == (home, "image_affinity")
