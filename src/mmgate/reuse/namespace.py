"""The uuid a backend sees (``K`` in DESIGN.md).

vLLM uses a uuid verbatim as a global processor-cache key, so with tenants every uuid is prefixed
by a tag derived from the tenant: tenant B can name tenant A's uuid but never reach A's entry.
Images without a client uuid get a content uuid (``sha256:<hex>``), namespaced the same way.
Without tenants a client uuid passes through verbatim (clients keep vLLM's semantics).
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

CONTENT_PREFIX = "sha256:"


@lru_cache(maxsize=1024)
def tenant_tag(tenant: str) -> str:
    """A short, stable, non-reversible tag of a tenant name."""
    return "t" + hashlib.blake2b(tenant.encode(), digest_size=8).hexdigest()


def backend_uuid(tenant: str | None, uuid: str) -> str:
    """The backend key of a client uuid."""
    return uuid if tenant is None else f"{tenant_tag(tenant)}/{uuid}"


def content_uuid(tenant: str | None, digest: str) -> str:
    """The backend key of an image the client sent without a uuid."""
    return backend_uuid(tenant, CONTENT_PREFIX + digest)
