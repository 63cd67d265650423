"""Stored responses' ids (the Responses API): minted per tenant, checked, and kept out of logs.

vLLM names a response by its request's ``request_id`` (its default: ``resp_<32 hex>``) and keeps
it, under that name, for ``GET``/``cancel`` ``/v1/responses/{id}`` and ``previous_response_id``.
With tenants the gateway names every response itself, ``resp_<32 hex nonce><32 hex MAC>``: the MAC
is HMAC-SHA256 of the nonce keyed by the tenant's tag (itself an HMAC of the tenant under
``--tenant-secret``), so whether an id is a tenant's is read from the id alone — on any gateway
that has the same secret, after a restart, with no shared state — and no client can name another
tenant's response, or choose an id at all (``request_id`` is refused).

``redact_response_path`` turns ``/v1/responses/resp_abc/cancel`` into ``/v1/responses/{id}/cancel``
for the access log and traces: a response id is a capability to read a stored answer.

Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

RESPONSE_ID_PREFIX = "resp_"
_NONCE_HEX = 32
_MAC_HEX = 32
_DOMAIN = b"mmgate-response-id:"
_MINTED = re.compile(rf"resp_([0-9a-f]{{{_NONCE_HEX}}})([0-9a-f]{{{_MAC_HEX}}})")
_STORED_PATH = re.compile(r"(/v1/responses/)[^/]+")


def _mac(tenant_tag: str, nonce: str) -> str:
    return hmac.new(tenant_tag.encode(), _DOMAIN + nonce.encode(), hashlib.sha256).hexdigest()[:_MAC_HEX]


def mint_response_id(tenant_tag: str) -> str:
    """A fresh response id that ``is_tenants_response`` recognises as ``tenant_tag``'s."""
    nonce = secrets.token_hex(_NONCE_HEX // 2)
    return f"{RESPONSE_ID_PREFIX}{nonce}{_mac(tenant_tag, nonce)}"


def is_tenants_response(response_id: str, tenant_tag: str) -> bool:
    """True when ``response_id`` was minted for ``tenant_tag`` (constant time in the MAC)."""
    found = _MINTED.fullmatch(response_id)
    return found is not None and hmac.compare_digest(found.group(2), _mac(tenant_tag, found.group(1)))


def redact_response_path(path: str) -> str:
    """``path`` with a stored response's id replaced by ``{id}`` (other paths unchanged)."""
    return _STORED_PATH.sub(r"\1{id}", path, count=1) if path.startswith("/v1/responses/") else path
