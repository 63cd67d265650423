"""Background upkeep of the shared tier: probes that close node breakers, topology refreshes.

One task per tier, alive only while there is work (an open breaker, a wanted refresh, an unknown
topology); it sleeps ``interval_s`` between rounds. Every probe and refresh is bounded by the
operation timeout, and no request ever waits for them: requests only read the breakers and the
slot map. A cluster node counts as back when it says ``cluster_state:ok`` (a restarted master
answers PING long before it serves its slots again); a standalone server when it answers PING.
After a node comes back, and while one is down, the slot map is refreshed through the configured
address, so a failover or a moved slot is learnt without waiting for a redirect.
"""

from __future__ import annotations

import asyncio
import logging
import time

from redis.asyncio import Redis

from mmgate.app_runtime import STOP_WAIT_S, stop_tasks
from mmgate.store.redis.breakers import NodeBreakers
from mmgate.store.redis.nodes import Nodes

log = logging.getLogger(__name__)

# While a node is down, refresh the slot map at most this often (a failover moves its slots).
_REFRESH_WHILE_DOWN_S = 1.0


class NodeHealth:
    """The per-node breakers of one tier and the task that probes and refreshes (module doc)."""

    def __init__(self, nodes: Nodes, breakers: NodeBreakers, *, interval_s: float, timeout_s: float) -> None:
        self.nodes = nodes
        self.breakers = breakers
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._refresh_wanted = False
        self._last_refresh = 0.0
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def is_open(self, node: str) -> bool:
        return self.breakers.is_open(node)

    def failed(self, node: str) -> None:
        """An operation on ``node`` failed: open its breaker, and (cluster) look for a new owner."""
        if self.breakers.record_failure(node, time.monotonic()) and self.nodes.is_cluster:
            self._refresh_wanted = True
        self._wake()

    def succeeded(self, node: str) -> None:
        if self.breakers.is_open(node):
            self.breakers.record_success(node)
            self.want_refresh()

    def want_refresh(self) -> None:
        """Refresh the slot map soon (a redirect was seen, or a slot has no known owner)."""
        if self.nodes.is_cluster:
            self._refresh_wanted = True
            self._wake()

    async def refresh(self, deadline: float | None = None) -> bool:
        """Refresh the slot map now, bounded by the operation timeout (or by ``deadline``, a loop
        time); False (logged) when the cluster did not answer."""
        if deadline is None:
            deadline = asyncio.get_running_loop().time() + self._timeout_s
        try:
            async with asyncio.timeout_at(deadline):
                await self.nodes.refresh()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # fail-open: keep the map we had, try again next round
            log.debug("shared cache topology refresh failed: %r", exc)
            return False
        finally:
            self._last_refresh = time.monotonic()
        self._refresh_wanted = False
        return True

    async def aclose(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            # One whose cancellation redis-py lost ends at its next round on _closed.
            await stop_tasks([task], STOP_WAIT_S)

    def _has_work(self) -> bool:
        return bool(self.breakers.open_nodes or self._refresh_wanted or not self.nodes.known)

    def _wake(self) -> None:
        if self._closed or (self._task is not None and not self._task.done()):
            return
        self._task = asyncio.create_task(self._run(), name="mmgate-shared-health")

    async def _run(self) -> None:
        while not self._closed and self._has_work():  # closed: a lost cancellation ends here too
            await asyncio.sleep(self._interval_s)
            now = time.monotonic()
            down = self.breakers.open_nodes
            if (self._refresh_wanted or not self.nodes.known
                    or (down and now - self._last_refresh >= _REFRESH_WHILE_DOWN_S)):
                await self.refresh()
            due = self.breakers.due_for_probe(time.monotonic())
            if due:
                back = await asyncio.gather(*(self._probe(node) for node in due))
                for node, ok in zip(due, back, strict=True):
                    if ok:
                        self.succeeded(node)

    async def _probe(self, node: str) -> bool:
        client = self.nodes.node(node)
        if client is None:  # the node left the map: nothing routes to it any more
            self.breakers.record_success(node)
            return False
        try:
            async with asyncio.timeout(self._timeout_s):
                return await _serving(client, cluster=self.nodes.is_cluster)
        except asyncio.CancelledError:
            raise
        except Exception:  # still down: the breaker stays open, probed again next round
            return False


async def _serving(client: Redis, *, cluster: bool) -> bool:
    if not cluster:
        return bool(await client.execute_command("PING"))
    info = await client.execute_command("CLUSTER", "INFO")
    if isinstance(info, dict):
        return str(info.get("cluster_state")) == "ok"
    text = info.decode() if isinstance(info, bytes) else str(info)
    return "cluster_state:ok" in text
