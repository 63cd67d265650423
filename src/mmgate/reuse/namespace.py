"""The uuid a backend sees (``K`` in docs/ARCHITECTURE.md): tenant-proof and forge-proof.

vLLM uses a uuid verbatim as a global processor-cache key. So:

* with tenants, every key starts with the tenant's tag, ``t`` + 32 hex digits of
  HMAC-SHA256(server secret, tenant name): no client can compute another tenant's tag without the
  secret (an unkeyed hash of the name could be computed by anyone who knows or guesses the name);
* images sent without a uuid get a content key, ``~sha256:<hex of the bytes>``, and a client uuid
  that starts with ``~`` gets one more ``~`` in front: a client uuid can never produce a key that
  starts with ``~s``, so no client uuid can stand for someone else's bytes;
* without tenants, every other client uuid passes verbatim (clients keep vLLM's semantics).

With tenants, the gateway also sets vLLM's ``cache_salt`` (which salts the prefix cache's block
hashes) to ``tenant tag/client salt``: requests of one tenant share prefix-cache blocks as they did,
a tenant's own salt still partitions its requests, and no tenant can reach (or time) another's
cached prefixes.

The secret is ``--tenant-secret`` / ``MMGATE_TENANT_SECRET``; unset, each process draws a random
one. Gateways that share a Redis (the uuid store is keyed by ``K``) must share the secret.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from functools import lru_cache

CONTENT_PREFIX = "~sha256:"
_ESCAPE = "~"


class KeySpace:
    """Builds backend keys from (tenant, client uuid) and (tenant, content digest)."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret if secret else secrets.token_bytes(32)
        self.tenant_tag = lru_cache(maxsize=4096)(self._tag)

    def _tag(self, tenant: str) -> str:
        mac = hmac.new(self._secret, tenant.encode("utf-8", "surrogatepass"), hashlib.sha256)
        return "t" + mac.hexdigest()[:32]

    def backend_uuid(self, tenant: str | None, uuid: str) -> str:
        """The backend key of a client uuid."""
        key = _ESCAPE + uuid if uuid.startswith(_ESCAPE) else uuid
        return key if tenant is None else f"{self.tenant_tag(tenant)}/{key}"

    def content_uuid(self, tenant: str | None, digest: str) -> str:
        """The backend key of an image the client sent without a uuid (``digest``: its SHA-256)."""
        key = CONTENT_PREFIX + digest
        return key if tenant is None else f"{self.tenant_tag(tenant)}/{key}"

    def cache_salt(self, tenant: str, client_salt: object) -> str:
        """vLLM's ``cache_salt`` for a request of ``tenant`` (``client_salt``: the client's own, or
        None). The tenant's tag always leads, so salts never collide across tenants."""
        tag = self.tenant_tag(tenant)
        return tag if client_salt is None or client_salt == "" else f"{tag}/{client_salt}"
