"""The shared image cache tier: Redis or Redis Cluster through redis-py asyncio, failing open.

``RedisSharedTier`` implements ``mmgate.store.types.SharedTier``:

* one Redis string per image (header + bytes, see ``mmgate.store.redis.format``), written with ``SET … EX``;
  a hit checks the entry's checksum and never decodes the image; a corrupt or truncated entry is
  deleted and reported as a miss, so the loader refills it from the origin;
* every operation is one attempt (no client retries) on the node that owns its key
  (``mmgate.store.redis.nodes``), bounded as a whole — pool wait, connect, I/O and one cluster redirect — by
  ``asyncio.timeout(connect + io)``, so a frozen server cannot hang a request;
* every failure — ``RedisError``, ``RedisClusterException`` (not a ``RedisError``), timeouts,
  ``OSError`` — becomes a ``CacheError`` at one boundary (``_call``) and is swallowed there: a
  miss, a no-op, or "fetch it yourself". Warnings are rate-limited. A node that does not answer
  (an error reply is an answer) opens the breaker of that node only (``NodeBreakers``): that node's keys bypass the cache, the other
  nodes' keys keep hitting, and a background probe closes it once the node serves again
  (``mmgate.store.redis.health``);
* a cross-process fill lease (``SET NX PX`` inside a Lua script that first checks the value)
  lets one process fetch a missing image while the others poll for it — for at most the
  fill-wait bound (``--fill-wait``), which is also the lease's lifetime, so a lease its holder
  could not release (a failed write, a cancelled request) stalls nobody for longer. The holder
  releases it on every path (the loader's ``finally``).

Value and lease keys of one entry share a hash tag, so on Redis Cluster both live on one slot
and the scripts and ``MGET`` touching both are single-slot commands.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import OrderedDict
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from redis.exceptions import AskError, ResponseError

from mmgate.config import CacheSettings, MediaSettings
from mmgate.errors import CacheError
from mmgate.store.redis.breakers import NodeBreakers, WarningLimiter
from mmgate.store.redis.client import build_client, operation_timeout_s
from mmgate.store.redis.format import (
    CorruptEntryError,
    MiB,
    decode_entry,
    encode_entry,
    entry_keys,
    size_bucket,
)
from mmgate.store.redis.health import NodeHealth
from mmgate.store.redis.nodes import Nodes, run_redirected
from mmgate.store.types import LoadedImage

log = logging.getLogger(__name__)

_LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)
# Entries at least this big are checksummed, copied and serialised in a thread, so a 16 MiB
# image does not stall the event loop for milliseconds.
_THREAD_BYTES = 2 * MiB
# wait_for_fill polls every 5 ms at first, backing off to 50 ms.
_POLL_FIRST_S = 0.005
_POLL_MAX_S = 0.05
# Probe rounds of open breakers (and topology refreshes) this often.
_PROBE_INTERVAL_S = 0.1
# Leases this process holds and may release (oldest forgotten first: they expire by themselves).
_MAX_HELD_LEASES = 4096

# KEYS: value, lease. ARGV: token, ttl_ms. 1 = lease taken; 0 = the value exists or someone
# else holds the lease (both mean: wait_for_fill). Checking the value first closes the race of a
# process that missed just before another one stored the value and dropped its lease.
_ACQUIRE_SCRIPT = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
"""
# KEYS: lease. ARGV: token. Delete the lease only while it is still ours.
_RELEASE_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# KEYS: value, lease. ARGV: entry, ttl_s, token. Store, then drop our lease in the same step.
_PUT_AND_RELEASE_SCRIPT = """
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
if redis.call('GET', KEYS[2]) == ARGV[3] then redis.call('DEL', KEYS[2]) end
return 1
"""


class SharedCacheMetrics:
    """Prometheus metrics of the shared tier (labels are bounded: never a key or a URL)."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        # No registry given: keep the metrics on a private one rather than the global default.
        registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.get_seconds = Histogram(
            "mmgate_shared_cache_get_seconds", "Shared image cache get duration.",
            ("outcome", "size_bucket"), buckets=_LATENCY_BUCKETS, registry=registry,
        )
        self.set_seconds = Histogram(
            "mmgate_shared_cache_set_seconds", "Shared image cache set duration.",
            ("outcome", "size_bucket"), buckets=_LATENCY_BUCKETS, registry=registry,
        )
        self.bypassed = Counter(
            "mmgate_shared_cache_bypassed", "Shared cache operations skipped during an error cooldown.",
            ("operation",), registry=registry,
        )
        self.corrupt = Counter(
            "mmgate_shared_cache_corrupt_entries", "Corrupt shared cache entries found and deleted.",
            registry=registry,
        )


class RedisSharedTier:
    """The ``SharedTier`` on Redis / Redis Cluster; every method fails open (see module doc)."""

    def __init__(
        self,
        nodes: Nodes,
        cache: CacheSettings,
        media: MediaSettings,
        metrics: SharedCacheMetrics,
        *,
        error_cooldown_s: float = 0.25,
        warn_interval_s: float = 60.0,
    ) -> None:
        self.nodes = nodes
        self._prefix = cache.key_prefix
        self._ttl_s = cache.cache_ttl_s
        self._op_timeout_s = operation_timeout_s(cache)
        # Waiters give up after the fill-wait bound; the lease lasts no longer than that.
        self._fill_wait_s = cache.fill_wait_s
        self._lease_ttl_ms = max(1, round(cache.fill_wait_s * 1000))
        self._max_image_bytes = media.max_image_bytes
        self._metrics = metrics
        self.health = NodeHealth(nodes, NodeBreakers(error_cooldown_s), interval_s=_PROBE_INTERVAL_S,
                                 timeout_s=self._op_timeout_s)
        self._warnings = WarningLimiter(warn_interval_s)
        self._held: OrderedDict[str, str] = OrderedDict()

    @property
    def lease_ttl_s(self) -> float:
        return self._lease_ttl_ms / 1000

    async def start(self) -> None:
        """Learn a cluster's slot map before the gateway serves (bounded by one operation
        timeout). A cluster that does not answer is no start-up failure: the tier fails open and
        keeps trying in the background."""
        if self.nodes.is_cluster and not await self.health.refresh():
            log.warning("shared image cache: the cluster did not answer at start-up; failing open "
                        "and retrying in the background")
            self.health.want_refresh()

    def storage_keys(self, key: str) -> tuple[str, str]:
        """The Redis keys (value, lease) behind cache key ``key``."""
        return entry_keys(self._prefix, key)

    async def get(self, key: str) -> LoadedImage | None:
        value_key, _ = entry_keys(self._prefix, key)
        start = time.perf_counter()
        try:
            raw = await self._call("get", value_key, "GET", value_key)
        except CacheError:  # fail-open: a broken cache is a miss
            self._observe_get("error", None, start)
            return None
        if raw is None:
            self._observe_get("miss", None, start)
            return None
        image = await self._decode(value_key, raw)
        self._observe_get("hit" if image is not None else "miss", len(raw), start)
        return image

    async def put(self, key: str, image: LoadedImage) -> None:
        if image.num_bytes > self._max_image_bytes:
            return
        value_key, lease_key = entry_keys(self._prefix, key)
        start = time.perf_counter()
        try:
            if image.num_bytes >= _THREAD_BYTES:
                raw = await asyncio.to_thread(encode_entry, image)
            else:
                raw = encode_entry(image)
        except ValueError as exc:  # an image we cannot describe in the header: just not shared
            self._warn("put", exc)
            return
        token = self._held.get(key)
        try:
            if token is None:
                await self._call("put", value_key, "SET", value_key, raw, "EX", self._ttl_s)
            else:
                await self._call("put", value_key, "EVAL", _PUT_AND_RELEASE_SCRIPT, 2,
                                 value_key, lease_key, raw, self._ttl_s, token)
        except CacheError:
            # fail-open: the image was served; it is just not shared. The lease stays ours to
            # release: the caller's release_fill_lease tries (and it expires with the fill wait).
            self._observe_set("error", image.num_bytes, start)
            return
        if token is not None and self._held.get(key) == token:
            del self._held[key]  # the script dropped it with the write
        self._observe_set("success", image.num_bytes, start)

    async def acquire_fill_lease(self, key: str) -> bool:
        value_key, lease_key = entry_keys(self._prefix, key)
        token = secrets.token_hex(16)
        try:
            taken = await self._call("lease", value_key, "EVAL", _ACQUIRE_SCRIPT, 2,
                                     value_key, lease_key, token, self._lease_ttl_ms)
        except CacheError:
            return True  # the cache is broken: fetch from the origin ourselves
        if int(taken) != 1:
            return False
        self._held[key] = token
        self._held.move_to_end(key)
        while len(self._held) > _MAX_HELD_LEASES:
            self._held.popitem(last=False)
        return True

    async def wait_for_fill(self, key: str) -> LoadedImage | None:
        """Poll for another process's fill for at most the fill-wait bound, polls included."""
        value_key, lease_key = entry_keys(self._prefix, key)
        delay = _POLL_FIRST_S
        raw: bytes | str | None = None
        try:
            async with asyncio.timeout(self._fill_wait_s):
                while raw is None:
                    try:
                        raw, lease = await self._call("wait", value_key, "MGET", value_key, lease_key)
                    except CacheError:  # fail-open: stop waiting, the caller fetches from the origin
                        return None
                    if raw is None and lease is None:
                        return None  # released or expired without a value: fetch it yourself
                    if raw is None:
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, _POLL_MAX_S)
        except TimeoutError:  # the fill wait is over: the caller fetches from the origin
            return None
        return await self._decode(value_key, raw)

    async def release_fill_lease(self, key: str) -> None:
        token = self._held.pop(key, None)
        if token is None:
            return
        _, lease_key = entry_keys(self._prefix, key)
        try:
            await self._call("release", lease_key, "EVAL", _RELEASE_SCRIPT, 1, lease_key, token)
        except CacheError:
            pass  # the lease expires by itself; waiters fall back to the origin then

    async def close(self) -> None:
        await self.health.aclose()
        try:
            await self.nodes.aclose()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # closing a broken connection must not fail shutdown
            log.debug("closing the shared cache client failed: %r", exc)

    async def _call(self, operation: str, key: str, *args: Any) -> Any:
        """Run one command on the node owning ``key``, bounded as a whole (one redirect
        included); any failure opens that node's breaker and becomes a ``CacheError``."""
        deadline = asyncio.get_running_loop().time() + self._op_timeout_s
        route = self.nodes.route(key)
        # start() was not called: the first operations join one refresh, inside their bound.
        if route is None and self.nodes.first_refresh_pending and await self.health.refresh(deadline):
            route = self.nodes.route(key)
        if route is None or self.health.is_open(route[0]):
            if route is None:
                self.health.want_refresh()  # a slot with no known owner: learn the map again
            self._metrics.bypassed.labels(operation).inc()
            raise CacheError(f"shared cache bypassed for this key's node ({operation})")
        node, client = route
        try:
            async with asyncio.timeout_at(deadline):
                try:
                    result = await client.execute_command(*args)
                except AskError as exc:  # MOVED (a subclass) or ASK: follow it once, same bound
                    redirect = self.nodes.redirected(exc)
                    if redirect is None:
                        raise
                    self.health.want_refresh()
                    node, client = redirect
                    result = await run_redirected(client, args, asking=type(exc) is AskError)
        except asyncio.CancelledError:
            raise  # our caller was cancelled: never swallowed
        except Exception as exc:  # fail-open: RedisError, RedisClusterException, timeouts, OSError
            if not isinstance(exc, ResponseError):  # an error reply means the node is up: no breaker
                self.health.failed(node)
            self._warn(operation, exc)
            raise CacheError(f"shared cache {operation} failed: {type(exc).__name__}") from exc
        self.health.succeeded(node)
        return result

    async def _decode(self, value_key: str, raw: bytes | str) -> LoadedImage | None:
        """The image in ``raw``, or None (a corrupt entry is deleted)."""
        if not isinstance(raw, bytes):  # the client never decodes responses; be strict anyway
            raw = b""
        try:
            if len(raw) >= _THREAD_BYTES:
                image = await asyncio.to_thread(decode_entry, raw)
            else:
                image = decode_entry(raw)
        except CorruptEntryError as exc:  # damaged entry: delete it and report a miss (refilled)
            self._metrics.corrupt.inc()
            self._warn("get (corrupt entry deleted)", exc)
            try:
                # Plain DEL: a fresh entry stored in between would be lost too, and refilled.
                await self._call("delete", value_key, "DEL", value_key)
            except CacheError:
                pass  # the corrupt entry expires with its TTL; every reader keeps rejecting it
            return None
        if image.num_bytes > self._max_image_bytes:
            return None  # stored under a larger limit: let the origin path apply the current one
        return image

    def _warn(self, operation: str, exc: BaseException) -> None:
        suppressed = self._warnings.allow(time.monotonic())
        if suppressed is None:
            return
        extra = f" ({suppressed} similar warnings suppressed)" if suppressed else ""
        log.warning("shared image cache: %s failed (%s: %s); failing open%s",
                    operation, type(exc).__name__, exc, extra)

    def _observe_get(self, outcome: str, num_bytes: int | None, start: float) -> None:
        self._metrics.get_seconds.labels(outcome, size_bucket(num_bytes)).observe(
            time.perf_counter() - start)

    def _observe_set(self, outcome: str, num_bytes: int | None, start: float) -> None:
        self._metrics.set_seconds.labels(outcome, size_bucket(num_bytes)).observe(
            time.perf_counter() - start)


def build_shared_tier(
    cache: CacheSettings, media: MediaSettings, registry: CollectorRegistry | None,
    *, error_cooldown_s: float = 0.25,
) -> RedisSharedTier | None:
    """The shared tier for ``cache.redis_url`` (None when unset).

    Raises ``ConfigError`` naming the setting for a bad URL or flag combination; does not
    contact the server (a server that is down is handled by failing open).
    """
    if not cache.redis_url:
        return None
    return RedisSharedTier(
        build_client(cache), cache, media, SharedCacheMetrics(registry), error_cooldown_s=error_cooldown_s)
