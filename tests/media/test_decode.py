"""The decode lanes and the per-request pixel budget, on real threads (no gateway)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from mmgate.errors import BusyError, ImageTooLargeError
from mmgate.media.decode import DecodeLanes, PixelBudget


def test_the_pixel_budget_refuses_the_image_that_crosses_it() -> None:
    budget = PixelBudget(100)
    budget.charge(60)
    budget.charge(40)
    with pytest.raises(ImageTooLargeError) as info:
        budget.charge(1)
    assert info.value.status == 400 and "--max-request-pixels" in info.value.message
    assert budget.used == 100


async def test_small_images_do_not_wait_behind_a_large_one_and_the_large_queue_is_bounded() -> None:
    lanes = DecodeLanes(workers=1, large_image_pixels=1000, max_queue_pixels=5000)
    release = threading.Event()
    try:
        big = asyncio.ensure_future(lanes.run(4000, release.wait, 10))
        await asyncio.sleep(0.05)
        assert lanes.queued_large_pixels == 4000
        started = time.perf_counter()
        assert await lanes.run(500, sum, [1, 2]) == 3  # the normal lane is free
        assert time.perf_counter() - started < 1
        with pytest.raises(BusyError) as info:
            await lanes.run(2000, sum, [1])  # 4000 + 2000 > 5000
        assert info.value.status == 429 and info.value.retry_after_s >= 1
        # A waiter that gives up does not free the lane: the decode still runs.
        big.cancel()
        await asyncio.sleep(0.05)
        assert lanes.queued_large_pixels == 4000
        release.set()
        for _ in range(100):
            if lanes.queued_large_pixels == 0:
                break
            await asyncio.sleep(0.01)
        assert lanes.queued_large_pixels == 0
        assert await lanes.run(9000, sum, [2]) == 2  # one image is always admitted to an empty lane
    finally:
        release.set()
        lanes.shutdown()


async def test_a_request_is_admitted_once_every_load_has_reported_and_all_or_nothing() -> None:
    lanes = DecodeLanes(workers=1, large_image_pixels=10, max_queue_pixels=100)
    try:
        # Two large images of 60: together over the queue, but an empty lane takes one request whole.
        budget = PixelBudget(1000, lanes, 3)
        a, b, cached = object(), object(), object()
        waiting = [asyncio.create_task(budget.admit(a, 60)), asyncio.create_task(budget.admit(b, 60))]
        await asyncio.sleep(0.01)
        assert not any(t.done() for t in waiting) and lanes.queued_large_pixels == 0  # the third has not said
        budget.stand_aside(cached)
        assert await asyncio.gather(*waiting) == [True, True] and lanes.queued_large_pixels == 120
        # The next request's two images do not both fit behind them: refused, nothing reserved.
        second = PixelBudget(1000, lanes, 2)
        refused = asyncio.gather(second.admit(object(), 20), second.admit(object(), 20), return_exceptions=True)
        assert [type(r) for r in await refused] == [BusyError, BusyError] and lanes.queued_large_pixels == 120
        lanes.release(120)
        # A request that stops loading before every load reported: the waiting one is not left hanging.
        third = PixelBudget(1000, lanes, 2)
        alone = asyncio.create_task(third.admit(object(), 30))
        await asyncio.sleep(0.01)
        third.abandon()
        assert await asyncio.wait_for(alone, 1) is True and lanes.queued_large_pixels == 30
    finally:
        lanes.shutdown()
