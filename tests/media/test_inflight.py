"""In-flight dedup: one shared run per key, failures not kept, cancellation isolated."""

from __future__ import annotations

import asyncio

import pytest

from mmgate.media.inflight import InflightMap


async def test_concurrent_callers_share_one_run() -> None:
    m: InflightMap[str, int] = InflightMap()
    release = asyncio.Event()
    runs = 0

    async def work() -> int:
        nonlocal runs
        runs += 1
        await release.wait()
        return 42

    tasks = [asyncio.create_task(m.run("k", work)) for _ in range(50)]
    await asyncio.sleep(0.01)
    assert runs == 1 and len(m) == 1
    release.set()
    results = await asyncio.gather(*tasks)
    assert [v for v, _ in results] == [42] * 50
    assert sum(1 for _, joined in results if not joined) == 1
    assert len(m) == 0


async def test_distinct_keys_run_separately() -> None:
    m: InflightMap[str, str] = InflightMap()

    async def work_for(key: str) -> str:
        await asyncio.sleep(0)
        return key

    results = await asyncio.gather(*(m.run(k, lambda k=k: work_for(k)) for k in ("a", "b", "a")))
    assert [v for v, _ in results] == ["a", "b", "a"]
    assert [j for _, j in results] == [False, False, True]


async def test_failure_reaches_every_waiter_and_is_not_kept() -> None:
    m: InflightMap[str, int] = InflightMap()
    release = asyncio.Event()
    runs = 0

    async def failing() -> int:
        nonlocal runs
        runs += 1
        await release.wait()
        raise RuntimeError("origin down")

    tasks = [asyncio.create_task(m.run("k", failing)) for _ in range(5)]
    await asyncio.sleep(0.01)
    release.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)
    assert runs == 1 and len(m) == 0

    async def ok() -> int:
        return 7

    assert await m.run("k", ok) == (7, False)  # the next call starts afresh


async def test_a_cancelled_waiter_does_not_cancel_the_others() -> None:
    m: InflightMap[str, int] = InflightMap()
    release = asyncio.Event()

    async def work() -> int:
        await release.wait()
        return 1

    first = asyncio.create_task(m.run("k", work))
    second = asyncio.create_task(m.run("k", work))
    await asyncio.sleep(0.01)
    first.cancel()  # the caller that started the work goes away
    with pytest.raises(asyncio.CancelledError):
        await first
    assert len(m) == 1
    release.set()
    assert await second == (1, True)
    assert len(m) == 0


async def test_work_is_cancelled_when_every_waiter_is_cancelled() -> None:
    m: InflightMap[str, int] = InflightMap()
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def work() -> int:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return 1

    first = asyncio.create_task(m.run("k", work))
    second = asyncio.create_task(m.run("k", work))
    await asyncio.wait_for(started.wait(), 5)
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    await asyncio.sleep(0.01)
    assert not cancelled.is_set() and len(m) == 1  # one waiter left: the work goes on for it
    second.cancel()
    await asyncio.gather(second, return_exceptions=True)
    await asyncio.wait_for(cancelled.wait(), 5)  # nobody waits any more: the work is stopped
    await asyncio.sleep(0)
    assert len(m) == 0


async def test_close_cancels_running_work() -> None:
    m: InflightMap[str, int] = InflightMap()
    started = asyncio.Event()

    async def forever() -> int:
        started.set()
        await asyncio.Event().wait()
        return 0

    waiter = asyncio.create_task(m.run("k", forever))
    await started.wait()
    await m.close()
    assert len(m) == 0
    with pytest.raises(asyncio.CancelledError):
        await waiter
