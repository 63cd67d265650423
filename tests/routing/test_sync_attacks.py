"""Attacks on the routing-sync channel, really published on a real redis-server to a gateway's
``RoutingSync`` in process (its record is a real ``BackendHoldings``, as the router's): forged
messages, a recorded message replayed, and a key holder flooding the largest valid messages or
many small ones. Each is dropped and counted, and what the flood gets applied stays within its
sender's budget."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from mmgate.config import GatewaySettings
from mmgate.fleet import BackendHoldings
from mmgate.metrics import GatewayMetrics
from mmgate.routing import PeerBudget, Routed, RoutingSync, sync_message
from mmgate.routing.sync.peers import MAX_KEYS, MAX_MESSAGE_KEYS
from mmgate.routing.sync.seal import MAX_MESSAGE_BYTES
from tests.support.redis_servers import RedisServer

SECRET = b"a test secret of the fleet, 32+ characters"
CHANNEL = "test:routing:attacks"
ATTACKER = "a77ac4e7a77ac4e7"


def largest_message(number: int, secret: bytes = SECRET) -> bytes:
    """The largest valid message: every routed request a message may carry, each with every key."""
    routed = [Routed("vllm-0", e, tuple(f"k{e}-{k}" for k in range(MAX_KEYS)))
              for e in range(MAX_MESSAGE_KEYS // MAX_KEYS)]
    data = sync_message(secret, ATTACKER, number, routed)
    assert len(data) <= MAX_MESSAGE_BYTES
    return data


class Victim:
    """One gateway's sync, listening; counts by outcome from its metrics."""

    def __init__(self, url: str, budget: PeerBudget) -> None:
        self.registry = CollectorRegistry()
        self.holdings = BackendHoldings.for_settings(GatewaySettings())
        self.sync = RoutingSync(
            Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5), CHANNEL,
            self.routed, secret=SECRET, io_timeout_s=0.5, clock=time.monotonic,
            metrics=GatewayMetrics(self.registry), budget=budget)
        self.applied = 0

    def routed(self, routed: Routed) -> None:
        self.applied += 1
        self.holdings.hold(routed.backend, [(key, 1024) for key in routed.keys])
        self.holdings.show(routed.keys, routed.token)

    def received(self, outcome: str) -> int:
        value = self.registry.get_sample_value(
            "mmgate_routing_sync_messages_total", {"direction": "received", "outcome": outcome})
        return int(value or 0)


@asynccontextmanager
async def victim(url: str, budget: PeerBudget | None = None) -> AsyncIterator[Victim]:
    v = Victim(url, budget if budget is not None else PeerBudget())
    task = asyncio.create_task(v.sync.run())
    try:
        async with asyncio.timeout(10):
            await v.sync.subscribed.wait()
        yield v
    finally:
        task.cancel()
        await asyncio.wait([task])
        await v.sync.close()


async def until(condition: object, timeout_s: float = 20.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.01)


async def test_forged_messages_are_dropped_unread_and_counted(standalone_server: RedisServer) -> None:
    async with victim(standalone_server.url) as v:
        forged = largest_message(0, secret=b"a guessed secret, also 32+ characters")
        tampered = bytearray(largest_message(0))
        tampered[-10] ^= 1  # a real message changed in flight
        with standalone_server.client() as raw:
            for _ in range(20):
                raw.publish(CHANNEL, forged)
            raw.publish(CHANNEL, bytes(tampered))
        await until(lambda: v.received("forged") == 21)
        assert v.applied == 0 and v.holdings.num_held("vllm-0") == 0
        assert v.received("ok") == 0
        assert v.sync.budget.spent_s == 0.0  # nothing was parsed, so nothing was charged


async def test_a_replayed_message_is_dropped_before_it_is_read(standalone_server: RedisServer) -> None:
    async with victim(standalone_server.url) as v:
        recorded = sync_message(SECRET, ATTACKER, 5, [Routed("vllm-1", 1, ("k",))])
        with standalone_server.client() as raw:
            raw.publish(CHANNEL, recorded)
            await until(lambda: v.received("ok") == 1)
            spent = v.sync.budget.spent_s
            for _ in range(10):
                raw.publish(CHANNEL, recorded)
            raw.publish(CHANNEL, sync_message(SECRET, ATTACKER, 4, [Routed("vllm-0", 1, ("j",))]))  # older still
        await until(lambda: v.received("replayed") == 11)
        assert v.applied == 1 and not v.holdings.holds("vllm-0", "j")
        assert v.sync.budget.spent_s == spent


async def test_a_flood_of_the_largest_valid_messages_gets_at_most_its_senders_budget(
    standalone_server: RedisServer,
) -> None:
    budget = PeerBudget()
    count = 400  # unbounded, ~0.3 s of event loop: three times what the budget allows here
    async with victim(standalone_server.url, budget) as v:
        started = time.monotonic()
        with standalone_server.client() as raw:
            for number in range(count):
                raw.publish(CHANNEL, largest_message(number))
        await until(lambda: v.received("ok") + v.received("over_budget") == count)
        elapsed = time.monotonic() - started
        assert v.received("over_budget") > 0
        applied = v.received("ok")
        assert applied < count
        assert v.applied == applied * (MAX_MESSAGE_KEYS // MAX_KEYS)
        # CPU it got: the burst, the refill over the flood, and the one message that was let in
        # while the budget still had some left (charged after it ran).
        assert budget.spent_s <= budget.burst_s + budget.cpu_per_s * elapsed + budget.largest_s


async def test_a_flood_of_small_messages_gets_at_most_its_senders_budget(standalone_server: RedisServer) -> None:
    # Each tiny message is charged what it took (tens of µs): a budget of 2 ms is a few dozen of them.
    budget = PeerBudget(cpu_per_s=0.0005, burst_s=0.002)
    count = 400
    async with victim(standalone_server.url, budget) as v:
        started = time.monotonic()
        with standalone_server.client() as raw:
            pipe = raw.pipeline(transaction=False)
            for number in range(count):
                pipe.publish(CHANNEL, sync_message(SECRET, ATTACKER, number, [Routed("vllm-0", number, ("k",))]))
            pipe.execute()
        await until(lambda: v.received("ok") + v.received("over_budget") == count)
        elapsed = time.monotonic() - started
        assert v.received("over_budget") > 0 and 0 < v.received("ok") < count
        assert budget.spent_s <= budget.burst_s + budget.cpu_per_s * elapsed + budget.largest_s
