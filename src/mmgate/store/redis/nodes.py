"""Where a shared-tier key lives: the one standalone server, or the master of its cluster slot.

Why not redis-py's ``RedisCluster``: after a connection error on one node it marks the whole
client for re-initialisation, so the next command for *any* key first waits (under one lock,
serially) for ``CLUSTER SLOTS`` through the seed node, and a failed re-initialisation closes the
connections of every node, in-flight ones included. One node down then stalls or fails every key,
operations overrun their bound, and the first concurrent calls of a fresh client race its
initialisation. Here the slot map is ours:

* it is learnt once before the gateway serves (``start``), then refreshed in the background
  only — on a redirect, when a node fails or comes back, or while it is unknown — always through
  the configured address (a DNS name or a proxy may stand for the cluster) and bounded by the
  operation timeout; a failed refresh keeps the map it had, so healthy nodes keep serving;
* every node gets its own plain ``redis.asyncio.Redis`` client (one pool each, no retries), so
  a node's trouble never touches another node's connections;
* a ``MOVED`` redirect updates that slot at once and is followed once inside the caller's bound;
  an ``ASK`` is followed once with ``ASKING`` on the same connection.

``route(key)`` is pure and never waits: None means the slot's owner is unknown (fail open).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot
from redis.exceptions import AskError

log = logging.getLogger(__name__)

STANDALONE = "standalone"
Route = tuple[str, Redis]
NodeFactory = Callable[[str, int], Redis]


def node_name(host: str, port: int) -> str:
    return f"{host}:{port}"


class StandaloneNodes:
    """One server: every key routes to it; there is no topology to learn."""

    is_cluster = False

    def __init__(self, client: Redis) -> None:
        self.client = client
        self._route: Route = (STANDALONE, client)

    @property
    def known(self) -> bool:
        return True

    @property
    def first_refresh_pending(self) -> bool:
        return False

    def route(self, key: str) -> Route:
        return self._route

    def node(self, name: str) -> Redis | None:
        return self.client if name == STANDALONE else None

    def names(self) -> list[str]:
        return [STANDALONE]

    def redirected(self, exc: AskError) -> Route | None:
        return None  # a standalone server never redirects

    async def refresh(self) -> None:
        return None

    async def aclose(self) -> None:
        await self.client.aclose()


class ClusterNodes:
    """A Redis Cluster's slot map and one client per master (module docstring)."""

    is_cluster = True

    def __init__(self, seed: Redis, seed_host: str, make_node: NodeFactory) -> None:
        self.seed = seed
        self._seed_host = seed_host
        self._make_node = make_node
        self._slots: list[str | None] = [None] * REDIS_CLUSTER_HASH_SLOTS
        self._clients: dict[str, Redis] = {}
        self._refreshing: asyncio.Task[None] | None = None
        self.refreshes = 0  # successful refreshes (tests read it)
        self.failed_refreshes = 0

    @property
    def known(self) -> bool:
        """True once a refresh has succeeded (the map may still have uncovered slots)."""
        return self.refreshes > 0

    @property
    def first_refresh_pending(self) -> bool:
        """Nothing tried yet: the first operations join one refresh rather than fail."""
        return self.refreshes == 0 and self.failed_refreshes == 0

    def route(self, key: str) -> Route | None:
        name = self._slots[key_slot(key.encode())]
        if name is None:
            return None
        return name, self._clients[name]

    def node(self, name: str) -> Redis | None:
        return self._clients.get(name)

    def names(self) -> list[str]:
        return list(self._clients)

    def redirected(self, exc: AskError) -> Route | None:
        """The node a ``MOVED``/``ASK`` reply points at; a ``MOVED`` also updates its slot now."""
        name = node_name(str(exc.host) or self._seed_host, int(exc.port))
        client = self._client_for(name)
        if type(exc) is not AskError and 0 <= exc.slot_id < REDIS_CLUSTER_HASH_SLOTS:
            self._slots[exc.slot_id] = name
        return name, client

    async def refresh(self) -> None:
        """Learn the slot map through the configured address; concurrent callers share one
        attempt. Raises what the server or the connection raised (the caller bounds and logs)."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.create_task(self._refresh())
            # Its callers may all have timed out: its failure is then nobody's to log.
            self._refreshing.add_done_callback(_retrieved)
        await asyncio.shield(self._refreshing)

    async def _refresh(self) -> None:
        try:
            reply = await self.seed.execute_command("CLUSTER", "SLOTS")
        except BaseException:
            self.failed_refreshes += 1
            raise
        slots: list[str | None] = [None] * REDIS_CLUSTER_HASH_SLOTS
        for first, last, master, *_replicas in reply:
            host = _text(master[0]) or self._seed_host
            name = node_name(host, int(master[1]))
            self._client_for(name)
            slots[int(first) : int(last) + 1] = [name] * (int(last) - int(first) + 1)
        owners = set(slots) - {None}
        gone = [self._clients.pop(name) for name in list(self._clients) if name not in owners]
        self._slots = slots
        self.refreshes += 1
        # A node that left the cluster: close its pool (never fails the refresh).
        await asyncio.gather(*(_close_quietly(client) for client in gone))

    def _client_for(self, name: str) -> Redis:
        client = self._clients.get(name)
        if client is None:
            host, _, port = name.rpartition(":")
            client = self._clients[name] = self._make_node(host, int(port))
        return client

    async def aclose(self) -> None:
        if self._refreshing is not None and not self._refreshing.done():
            self._refreshing.cancel()
        clients = [self.seed, *self._clients.values()]
        self._clients.clear()
        self._slots = [None] * REDIS_CLUSTER_HASH_SLOTS
        await asyncio.gather(*(_close_quietly(c) for c in clients))


Nodes = StandaloneNodes | ClusterNodes


async def run_redirected(client: Redis, args: tuple[Any, ...], *, asking: bool) -> Any:
    """``args`` on ``client``; after an ``ASK``, preceded by ``ASKING`` on the same connection."""
    if not asking:
        return await client.execute_command(*args)
    pipe = client.pipeline(transaction=False)
    pipe.execute_command("ASKING")
    pipe.execute_command(*args)
    return (await pipe.execute())[1]


def _retrieved(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def _close_quietly(client: Redis) -> None:
    try:
        await client.aclose()
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # closing a broken connection must never fail the caller
        log.debug("closing a shared cache node client failed: %r", exc)
