"""The shared tier's background health task stops when its tier closes, even when redis-py loses
the cancellation (redis/redis-py#2028)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from redis.asyncio import Redis

from mmgate.store.redis.breakers import NodeBreakers
from mmgate.store.redis.health import NodeHealth
from mmgate.store.redis.nodes import STANDALONE, StandaloneNodes
from tests.support.ports import free_port


class LosesCancellations(NodeHealth):
    """The real health task, except that a topology refresh cancelled in flight returns instead of
    raising, as a redis-py command can when the cancellation lands at the wrong moment (that moment
    cannot be timed against a real server). ``refreshing`` is set while a refresh is in flight."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.refreshing = asyncio.Event()

    async def refresh(self, deadline: float | None = None) -> bool:
        self.refreshing.set()
        try:
            await asyncio.sleep(0.2)
        except asyncio.CancelledError:
            return False
        finally:
            self.refreshing.clear()
        return True


async def test_closing_stops_the_health_task_even_when_a_cancellation_is_lost() -> None:
    # Nothing listens on the port: the node's probes fail, so its breaker stays open and the task has
    # work for as long as it runs.
    client = Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.2, socket_timeout=0.2)
    health = LosesCancellations(StandaloneNodes(client), NodeBreakers(0.01), interval_s=0.01, timeout_s=0.2)
    health.failed(STANDALONE)
    task = health._task
    assert task is not None
    try:
        async with asyncio.timeout(5):
            await health.refreshing.wait()  # it refreshes while the node is down
        started = time.monotonic()
        await health.aclose()  # the cancellation lands in the refresh, which returns as if nothing happened
        assert time.monotonic() - started < 1.0
        done, _ = await asyncio.wait([task], timeout=1)
        assert done, "the health task went on after its tier closed"
    finally:
        task.cancel()
        await asyncio.wait([task], timeout=1)
        await client.aclose()
