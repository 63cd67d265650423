"""The shared image cache tier: Redis or Redis Cluster through redis-py asyncio, failing open.

``RedisSharedTier`` implements ``mmgate.store.types.SharedTier``:

* one Redis string per image (header + bytes, see ``shared_format``), written with ``SET … EX``;
  a hit checks the header's CRC and never decodes the image; a corrupt or truncated entry is
  deleted and reported as a miss, so the loader refills it from the origin;
* every operation is one attempt (no client retries), bounded by the connect/I/O socket timeouts
  and, on top, by ``asyncio.timeout(connect + io)`` so a frozen server cannot hang a request;
* every failure — ``RedisError``, ``RedisClusterException`` (not a ``RedisError``), timeouts,
  ``OSError`` — becomes a ``CacheError`` at one boundary (``_call``) and is swallowed there: a
  miss, a no-op, or "fetch it yourself". Warnings are rate-limited; after a failure the cache is
  bypassed for a short cooldown, then tried again (the client reconnects by itself);
* a cross-process fill lease (``SET NX PX`` inside a Lua script that first checks the value)
  lets one process fetch a missing image while the others poll for it.

Value and lease keys of one entry share a hash tag, so on Redis Cluster both live on one slot
and the scripts and ``MGET`` touching both are single-slot commands.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram

from mmgate.config import CacheSettings, MediaSettings
from mmgate.errors import CacheError
from mmgate.store.redis.client import SharedClient, build_client, operation_timeout_s
from mmgate.store.redis.format import (
    CorruptEntryError,
    ErrorCooldown,
    MiB,
    WarningLimiter,
    decode_entry,
    encode_entry,
    entry_keys,
    size_bucket,
)
from mmgate.store.types import LoadedImage, SharedTier

log = logging.getLogger(__name__)

T = TypeVar("T")

_LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)
# Entries at least this big are checksummed/serialised in a thread (zlib releases the GIL), so
# a 16 MiB image does not stall the event loop for milliseconds.
_THREAD_BYTES = 2 * MiB
# wait_for_fill polls every 5 ms at first, backing off to 50 ms.
_POLL_FIRST_S = 0.005
_POLL_MAX_S = 0.05
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
        client: SharedClient,
        cache: CacheSettings,
        media: MediaSettings,
        metrics: SharedCacheMetrics,
        *,
        error_cooldown_s: float = 1.0,
        warn_interval_s: float = 60.0,
    ) -> None:
        self._client = client
        self._prefix = cache.key_prefix
        self._ttl_s = cache.cache_ttl_s
        self._op_timeout_s = operation_timeout_s(cache)
        # The lease lives about as long as an origin fetch may take.
        self._lease_ttl_ms = max(1, round(media.total_timeout_s * 1000))
        self._max_image_bytes = media.max_image_bytes
        self._metrics = metrics
        self._cooldown = ErrorCooldown(error_cooldown_s)
        self._warnings = WarningLimiter(warn_interval_s)
        self._held: OrderedDict[str, str] = OrderedDict()

    @property
    def lease_ttl_s(self) -> float:
        return self._lease_ttl_ms / 1000

    def storage_keys(self, key: str) -> tuple[str, str]:
        """The Redis keys (value, lease) behind cache key ``key``."""
        return entry_keys(self._prefix, key)

    async def get(self, key: str) -> LoadedImage | None:
        value_key, _ = entry_keys(self._prefix, key)
        start = time.perf_counter()
        try:
            raw = await self._call("get", lambda: self._client.get(value_key))
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
        token = self._held.pop(key, None)
        try:
            if token is None:
                await self._call("put", lambda: self._client.set(value_key, raw, ex=self._ttl_s))
            else:
                await self._call("put", lambda: self._client.eval(
                    _PUT_AND_RELEASE_SCRIPT, 2, value_key, lease_key, raw, self._ttl_s, token))
        except CacheError:  # fail-open: the image was served; it is just not shared
            self._observe_set("error", image.num_bytes, start)
            return
        self._observe_set("success", image.num_bytes, start)

    async def acquire_fill_lease(self, key: str) -> bool:
        value_key, lease_key = entry_keys(self._prefix, key)
        token = secrets.token_hex(16)
        try:
            taken = await self._call("lease", lambda: self._client.eval(
                _ACQUIRE_SCRIPT, 2, value_key, lease_key, token, self._lease_ttl_ms))
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
        value_key, lease_key = entry_keys(self._prefix, key)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.lease_ttl_s + self._op_timeout_s
        delay = _POLL_FIRST_S
        while True:
            try:
                raw, lease = await self._call("wait", lambda: self._client.mget(value_key, lease_key))
            except CacheError:  # fail-open: stop waiting, the caller fetches from the origin
                return None
            if raw is not None:
                return await self._decode(value_key, raw)
            remaining = deadline - loop.time()
            if lease is None or remaining <= 0:
                return None
            await asyncio.sleep(min(delay, remaining))
            delay = min(delay * 2, _POLL_MAX_S)

    async def release_fill_lease(self, key: str) -> None:
        token = self._held.pop(key, None)
        if token is None:
            return
        _, lease_key = entry_keys(self._prefix, key)
        try:
            await self._call("release", lambda: self._client.eval(_RELEASE_SCRIPT, 1, lease_key, token))
        except CacheError:
            pass  # the lease expires by itself; waiters fall back to the origin then

    async def close(self) -> None:
        try:
            await self._client.aclose()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # closing a broken connection must not fail shutdown
            log.debug("closing the shared cache client failed: %r", exc)

    async def _call(self, operation: str, command: Callable[[], Awaitable[T]]) -> T:
        """Run one Redis command, bounded; any failure becomes a ``CacheError``."""
        if self._cooldown.is_open(time.monotonic()):
            self._metrics.bypassed.labels(operation).inc()
            raise CacheError(f"shared cache bypassed after a recent failure ({operation})")
        try:
            async with asyncio.timeout(self._op_timeout_s):
                result = await command()
        except asyncio.CancelledError:
            raise  # our caller was cancelled: never swallowed
        except Exception as exc:  # fail-open: RedisError, RedisClusterException, timeouts, OSError
            self._cooldown.record_failure(time.monotonic())
            self._warn(operation, exc)
            raise CacheError(f"shared cache {operation} failed: {type(exc).__name__}") from exc
        self._cooldown.record_success()
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
                await self._call("delete", lambda: self._client.delete(value_key))
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
    *, error_cooldown_s: float = 1.0,
) -> SharedTier | None:
    """The shared tier for ``cache.redis_url`` (None when unset).

    Raises ``ConfigError`` naming the setting for a bad URL or flag combination; does not
    contact the server (a server that is down is handled by failing open).
    """
    if not cache.redis_url:
        return None
    client = build_client(cache)
    return RedisSharedTier(
        client, cache, media, SharedCacheMetrics(registry), error_cooldown_s=error_cooldown_s)
