"""Byte storage of the gateway: the byte-bounded LRU, the ``LoadedImage`` value and the
``SharedTier`` protocol, and the shared Redis / Redis Cluster tier (``store.redis``)."""

from mmgate.store.lru import ByteLRU
from mmgate.store.redis import RedisSharedTier, build_shared_tier
from mmgate.store.types import LoadedImage, SharedTier

__all__ = ["ByteLRU", "LoadedImage", "RedisSharedTier", "SharedTier", "build_shared_tier"]
