"""Routing sync between the gateways of one fleet over Redis pub/sub, off the request path.

With ``--routing-sync`` (on the ``--redis-url``) or ``--routing-sync-url`` each gateway publishes,
on ``--routing-sync-channel``, the requests its backends answered: one message as soon as one
was answered, then at most one per ``INTERVAL_S`` (the ones answered in between go together in
the next; ``mmgate.routing.sync.peers`` has the format). Each gateway subscribes to the same channel,
skips its own messages and records every answered request in its own record of what each backend
holds (``on_routed``), as if its own backend had answered it. docs/ROUTING.md has what it buys.

Nothing on the request path waits for Redis: ``routed`` only queues (bounded: at most
``MAX_PENDING`` routed requests wait; beyond that the oldest are dropped, counted). Fails open: a
publish that fails or times out is counted and its routed requests go again with the next message
(at least once; the queue's bound still holds), the listener reconnects with backoff
(0.25 s doubling to 5 s), and meanwhile each gateway routes on its own record. Messages are
signed with the fleet's shared secret and each sender is held to a budget of the event loop
(``mmgate.routing.sync.seal``, ``mmgate.routing.sync.senders``); a message that is not signed, is a replay, is over its budget or
is not a message (``InvalidSync``) is dropped whole and counted by why; it cannot reach the record.

Redis Cluster: PUBLISH on any node reaches subscribers on every node, so the URL may name any one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from mmgate.config import CacheSettings
from mmgate.errors import ConfigError
from mmgate.metrics import GatewayMetrics
from mmgate.routing.sync.peers import InvalidSync, Routed, decode, encode, take
from mmgate.routing.sync.seal import MAC_BYTES, SENDER_CHARS, Refused, seal, unseal
from mmgate.routing.sync.senders import PeerBudget
from mmgate.store.redis.client import build_client

log = logging.getLogger(__name__)

SYNC_URL_SETTING = "--routing-sync-url"
# At most one message per this many seconds (the first answer goes out at once, later ones together).
INTERVAL_S = 0.01
MAX_PENDING = 4096
LISTEN_WAIT_S = 1.0
BACKOFF_S = (0.25, 5.0)


def _cancelled() -> bool:
    """True when this task has been cancelled and the cancellation got lost on the way: redis-py's
    asyncio client can return normally from a command cancelled at the wrong moment
    (redis/redis-py#2028; a publish did in 2 of 8 runs of a sync test), and a loop
    would go round forever and its gateway never stop. Each loop looks before it goes round again."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def sync_client(url: str, cache: CacheSettings) -> Redis:
    """A lazily connecting client for ``url`` with the shared cache's timeouts (no I/O yet)."""
    settings = cache.model_copy(update={"redis_url": url, "redis_cluster": False})
    try:
        nodes = build_client(settings)
    except ConfigError as exc:
        raise ConfigError(SYNC_URL_SETTING, exc.message.split(": ", 1)[-1]) from None
    client = nodes.node(nodes.names()[0])
    assert client is not None
    return client


class RoutingSync:
    """Publishes the requests this gateway's backends answered, applies the others'. ``run`` until cancelled."""

    def __init__(
        self, client: Redis, channel: str, on_routed: Callable[[Routed], None], *,
        secret: bytes, io_timeout_s: float, clock: Callable[[], float], metrics: GatewayMetrics | None = None,
        interval_s: float = INTERVAL_S, budget: PeerBudget | None = None,
    ) -> None:
        self.gateway_id = secrets.token_hex(SENDER_CHARS // 2)
        self._own = self.gateway_id.encode()
        self._secret = secret
        self._number = 0  # of this gateway's next message: the others drop any not above the last
        self.budget = budget if budget is not None else PeerBudget()
        self._client = client  # publishes on pooled connections; the subscription holds one of its own
        self._channel = channel
        self._on_routed = on_routed
        self._interval_s = interval_s
        self._io_timeout_s = io_timeout_s
        self._clock = clock
        self._metrics = metrics
        self._pending: deque[Routed] = deque()
        self._wake = asyncio.Event()
        self.subscribed = asyncio.Event()

    def routed(self, backend: str, token: int, keys: Sequence[str]) -> None:
        """``backend`` just answered this gateway's request with ``keys`` for session ``token``
        (the request path: it only queues)."""
        if len(self._pending) >= MAX_PENDING:
            self._pending.popleft()
            self._count("sent", "dropped")
        self._pending.append(Routed(backend, token, tuple(keys)))
        self._wake.set()

    async def run(self) -> None:
        """Publish and listen until cancelled."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._publish_loop())
            group.create_task(self._listen_loop())

    async def publish_once(self) -> bool:
        """Send the next batch of answered requests (True: sent, or nothing to send)."""
        batch = take(self._pending)
        if not batch:
            return True
        data = seal(self._secret, self.gateway_id, self._number, encode(batch))
        self._number += 1
        try:
            async with asyncio.timeout(self._io_timeout_s):
                await self._client.publish(self._channel, data)
        except (TimeoutError, RedisError, OSError) as exc:
            self._count("sent", "error")
            log.debug("routing sync publish failed: %s", exc)
            # Back in front, within the bound (the oldest go first, counted). At least once: a publish
            # that timed out may still have gone out, and a request recorded twice is recorded once.
            self._pending.extendleft(reversed(batch))
            while len(self._pending) > MAX_PENDING:
                self._pending.popleft()
                self._count("sent", "dropped")
            return False
        self._count("sent", "ok")
        return True

    def apply(self, data: bytes) -> bool:
        """Apply one message from the channel (False: dropped, counted by why)."""
        if data[MAC_BYTES:MAC_BYTES + SENDER_CHARS] == self._own:
            return True  # our own, handed back by the channel (a forgery of it is as harmless)
        started = time.thread_time()  # CPU, not wall: time the machine gave others is not the sender's
        try:
            sender, number, body = unseal(self._secret, data)
            self.budget.admit(sender, number, self._clock())
        except Refused as exc:
            self._count("received", exc.outcome)
            log.debug("routing sync message dropped: %s", exc)
            return False
        try:
            for routed in decode(body):
                self._on_routed(routed)
        except InvalidSync as exc:
            self._count("received", "invalid")
            log.debug("routing sync message refused: %s", exc)
            return False
        finally:
            self.budget.charge(sender, time.thread_time() - started)
        self._count("received", "ok")
        return True

    async def _publish_loop(self) -> None:
        # The first answer goes out at once, then at most one message per interval (the ones
        # answered in between go together); a failed publish backs off.
        delay = self._interval_s
        while True:
            if _cancelled():
                raise asyncio.CancelledError
            if not self._pending:
                await self._wake.wait()
            self._wake.clear()
            try:
                ok = await self.publish_once()
            except Exception:
                log.exception("routing sync publish raised")
                ok = False
            delay = self._interval_s if ok else min(BACKOFF_S[1], max(BACKOFF_S[0], 2 * delay))
            await asyncio.sleep(delay)

    async def _listen_loop(self) -> None:
        delay = BACKOFF_S[0]
        warned = False
        while True:
            if _cancelled():
                raise asyncio.CancelledError
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self._channel)
                self.subscribed.set()
                if warned:
                    log.info("routing sync listening again on %s", self._channel)
                delay, warned = BACKOFF_S[0], False
                while True:
                    if _cancelled():
                        raise asyncio.CancelledError
                    message: dict[str, Any] | None = await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=LISTEN_WAIT_S)
                    if message is not None and message.get("type") == "message":
                        data = message["data"]
                        try:
                            self.apply(data if isinstance(data, bytes) else str(data).encode())
                        except Exception:
                            # A bug in applying one message must not end the sync: say so, go on.
                            log.exception("routing sync message could not be applied")
            except (TimeoutError, RedisError, OSError) as exc:
                self.subscribed.clear()
                if not warned:
                    log.warning("routing sync lost its subscription (%s): each gateway routes on its own "
                                "record until it is back", type(exc).__name__)
                    warned = True
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
            await asyncio.sleep(delay)
            delay = min(BACKOFF_S[1], 2 * delay)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._client.aclose()

    def _count(self, direction: str, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.routing_sync_messages.labels(direction, outcome).inc()
