"""Image reuse: tenant-namespaced uuids (``namespace``), the per-request plan and its store writes
(``plan``), the UUID store (``store``), API keys → tenants (``tenants``), recognising and healing a
backend's cache miss (``heal``), and the send loop that strips what a backend holds and heals its
misses (``sender``; what each backend holds is the router's ``mmgate.routing.BackendHoldings``)."""

from mmgate.reuse.heal import MAX_HEALS, reply_cache_miss_index, resolve_from_store
from mmgate.reuse.namespace import CONTENT_PREFIX, KeySpace, client_cache_salt
from mmgate.reuse.plan import (
    ImageSlot,
    ReuseCounts,
    SlotPlan,
    known_by_uuid,
    plan_slots,
    render,
    routed_images,
)
from mmgate.reuse.sender import ReuseSender, reply_headers
from mmgate.reuse.store import UUIDStore
from mmgate.reuse.tenants import TenantKeys

__all__ = [
    "CONTENT_PREFIX", "MAX_HEALS", "ImageSlot", "KeySpace", "ReuseCounts", "ReuseSender", "SlotPlan", "TenantKeys",
    "UUIDStore", "client_cache_salt", "known_by_uuid", "plan_slots", "render", "reply_cache_miss_index", "reply_headers",
    "resolve_from_store", "routed_images",
]
