"""The shared tier on Redis / Redis Cluster (fail-open): ``tier`` (the ``SharedTier``), ``client``
(building the redis-py client from settings), ``format`` (entry encoding, checksums, buckets)."""

from mmgate.store.redis.tier import RedisSharedTier, SharedCacheMetrics, build_shared_tier

__all__ = ["RedisSharedTier", "SharedCacheMetrics", "build_shared_tier"]
