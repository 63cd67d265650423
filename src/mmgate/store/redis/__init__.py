"""The shared tier on Redis / Redis Cluster (fail-open): ``tier`` (the ``SharedTier``), ``client``
(building the redis-py clients from settings), ``format`` (entry encoding, checksums, buckets),
``nodes`` (which node holds a key), ``breakers`` (per-node breakers, warning limit) and ``health``
(the background probes that close breakers and refresh the slot map)."""

from mmgate.store.redis.tier import RedisSharedTier, SharedCacheMetrics, build_shared_tier

__all__ = ["RedisSharedTier", "SharedCacheMetrics", "build_shared_tier"]
