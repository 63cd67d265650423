"""What the load generator plays and when: sessions in order (replayed with a ``#pass`` suffix),
the request budget, and the rate gate's slots — evenly spaced, continuing sessions before new
ones, everyone released with None on close. Real event loop, real clock."""

from __future__ import annotations

import asyncio
import itertools
import time

from mmgate.bench.dataset import Session, Turn
from mmgate.bench.schedule import RateGate, RequestBudget, SessionSource


def session(sid: str) -> Session:
    return Session(session_id=sid, turns=(Turn(texts=("hi",), images=()),), accumulate_history=False)


def name(source: SessionSource) -> str:
    item = source.next()
    assert item is not None
    return item[0]


def test_session_source_plays_once_or_cycles_with_pass_suffix() -> None:
    once = SessionSource([session("a"), session("b")], cycle=False, prefix="w-")
    assert [name(once) for _ in range(2)] == ["w-a", "w-b"]
    assert once.next() is None
    cycled = SessionSource([session("a"), session("b")], cycle=True)
    assert [name(cycled) for _ in range(5)] == ["a", "b", "a#1", "b#1", "a#2"]
    assert SessionSource([], cycle=True).next() is None


def test_request_budget() -> None:
    budget = RequestBudget(2)
    assert [budget.take() for _ in range(3)] == [True, True, False]
    assert budget.remaining == 0
    unlimited = RequestBudget(None)
    assert all(unlimited.take() for _ in range(1000))


async def test_constant_rate_slots_are_evenly_spaced() -> None:
    gate = RateGate(rate=200.0, arrival="constant")
    runner = asyncio.create_task(gate.run())
    try:
        waits = [asyncio.create_task(gate.wait(fresh=True)) for _ in range(5)]
        slots = await asyncio.wait_for(asyncio.gather(*waits), 5)
    finally:
        gate.close()
        await asyncio.wait_for(runner, 5)
    ns = [s for s in slots if s is not None]
    assert len(ns) == 5
    gaps = [b - a for a, b in itertools.pairwise(ns)]
    assert gaps == [5_000_000] * 4  # 1/200 s exactly: each slot is computed from the previous one
    assert time.perf_counter_ns() >= ns[-1]


async def test_continuing_sessions_get_the_slot_before_new_ones() -> None:
    gate = RateGate(rate=50.0, arrival="poisson", seed=3)
    order: list[str] = []

    async def want(label: str, fresh: bool) -> None:
        if await gate.wait(fresh=fresh) is not None:
            order.append(label)

    fresh = [asyncio.create_task(want(f"new{i}", True)) for i in range(3)]
    await asyncio.sleep(0)  # the new sessions queue first...
    continuing = asyncio.create_task(want("turn2", False))
    await asyncio.sleep(0)  # ...then a session under way asks
    runner = asyncio.create_task(gate.run())
    try:
        await asyncio.wait_for(asyncio.gather(continuing, fresh[0]), 5)
    finally:
        gate.close()
        await asyncio.wait_for(asyncio.gather(runner, *fresh), 5)
    assert order[:2] == ["turn2", "new0"]


async def test_close_fresh_and_close_release_waiters_with_none() -> None:
    gate = RateGate(rate=1.0, arrival="constant")  # no run(): nobody gets a slot
    fresh = asyncio.create_task(gate.wait(fresh=True))
    continuing = asyncio.create_task(gate.wait(fresh=False))
    await asyncio.sleep(0)
    gate.close_fresh()
    assert await asyncio.wait_for(fresh, 1) is None
    assert await gate.wait(fresh=True) is None  # no new session after close_fresh
    assert not continuing.done()
    gate.close()
    assert await asyncio.wait_for(continuing, 1) is None
    assert await gate.wait(fresh=False) is None
