"""Image reuse: tenant-namespaced uuids (``namespace``), the per-request plan and its store writes
(``plan``), what each backend was sent (``sent``), the UUID store (``store``), API keys → tenants
(``tenants``), and the send loop that strips repeats and heals cache misses (``heal``)."""

from mmgate.reuse.heal import MAX_HEALS, ReuseSender, reply_cache_miss_index, resolve_from_store
from mmgate.reuse.namespace import CONTENT_PREFIX, KeySpace
from mmgate.reuse.plan import ImageSlot, ReuseCounts, SlotPlan, known_by_uuid, plan_slots, render
from mmgate.reuse.sent import SentTracker
from mmgate.reuse.store import UUIDStore
from mmgate.reuse.tenants import TenantKeys

__all__ = [
    "CONTENT_PREFIX", "MAX_HEALS", "ImageSlot", "KeySpace", "ReuseCounts", "ReuseSender", "SentTracker", "SlotPlan", "TenantKeys", "UUIDStore",
    "known_by_uuid", "plan_slots", "render", "reply_cache_miss_index", "resolve_from_store",
]
