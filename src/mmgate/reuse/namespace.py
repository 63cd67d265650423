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
hashes) to the tenant's tag, or ``tag-<32 hex of SHA-256(client salt)>`` when the client sent one:
requests of one tenant share prefix-cache blocks as they did, a tenant's own salt still partitions
its requests, and no tenant can reach (or time) another's cached prefixes. The client's salt is
hashed, not appended: vLLM refuses a salt past 128 characters or with ``/``, ``@``, ``\\`` or NUL,
and the tag plus the longest salt vLLM accepts would cross that.

The secret is ``--tenant-secret`` / ``MMGATE_TENANT_SECRET``; unset, each process draws a random
one. Gateways that share a Redis (the uuid store is keyed by ``K``) must share the secret.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from functools import lru_cache
from typing import Any

from mmgate.errors import InvalidRequestError

CONTENT_PREFIX = "~sha256:"
_ESCAPE = "~"
# A backend key with tenants: the tag (``t`` + 32 hex digits), ``/``, the client's key.
_TAG_LENGTH = 33


def tag_of(key: str) -> str:
    """The tenant tag that leads backend key ``key`` ("" for a key without one: a gateway without
    tenants)."""
    if len(key) > _TAG_LENGTH and key[_TAG_LENGTH] == "/" and key[0] == "t":
        return key[:_TAG_LENGTH]
    return ""


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

    def cache_salt(self, tenant: str, client_salt: str | None) -> str:
        """vLLM's ``cache_salt`` for a request of ``tenant`` (``client_salt``: the client's own,
        checked by ``client_cache_salt``, or None). The tenant's tag always leads, so salts never
        collide across tenants; the result is always one vLLM accepts (66 characters at most)."""
        tag = self.tenant_tag(tenant)
        if client_salt is None:
            return tag
        return f"{tag}-{hashlib.sha256(client_salt.encode('utf-8', 'surrogatepass')).hexdigest()[:32]}"


# vLLM's own rule for a client's cache_salt (``validate_cache_salt`` in vLLM's protocol): checked
# here because the backend only ever sees the tenant's salt, never the client's.
MAX_CACHE_SALT_LENGTH = 128
_FORBIDDEN_SALT_CHARS = frozenset("@/\\\x00")


def client_cache_salt(body: dict[str, Any]) -> str | None:
    """The request's own ``cache_salt`` (None when absent), or a 400 naming it when vLLM would
    refuse it: not a string, empty, longer than 128 characters, or with ``@ / \\`` or NUL."""
    salt = body.get("cache_salt")
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt:
        raise InvalidRequestError("'cache_salt' must be a non-empty string", param="cache_salt")
    if len(salt) > MAX_CACHE_SALT_LENGTH or not _FORBIDDEN_SALT_CHARS.isdisjoint(salt):
        raise InvalidRequestError(
            f"'cache_salt' must be at most {MAX_CACHE_SALT_LENGTH} characters without '@', '/', '\\\\' or NUL",
            param="cache_salt")
    return salt
