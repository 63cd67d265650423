"""Cache keys for the image tiers (local LRU, in-flight map, shared tier). Pure functions.

* URL images: ``url:<sha256 of the normalised URL>``. Normalising lower-cases the scheme and
  host, drops a default port and the fragment, and keeps path, query and userinfo as written
  (servers may treat them case-sensitively). Hashing keeps keys short and keeps URLs, with
  whatever secrets their queries hold, out of the shared cache's key space.
* ``data:`` images: ``img:<sha256 of the decoded bytes>``, the image's digest
  (``LoadedImage.digest``): one hash for a new image's key and digest, and every spelling of
  the same bytes (a data: URL's type label, non-canonical base64) is one entry. Decoding
  base64 (SIMD) and hashing the bytes costs less than hashing the text (~90 against ~120 µs for
  a 150 KB screenshot); a repeat the loader has just seen costs neither (``mmgate.media.repeats``).
* Session scoping: ``s:<hash of the session id>:<key>``; tenant scoping (with API keys):
  ``t:<tenant tag>:<key>``, so one tenant never hits (and cannot time) an image another tenant
  loaded; see ``scope_key``.

The shared tier adds ``CacheSettings.key_prefix`` itself.
"""

from __future__ import annotations

import hashlib
from urllib.parse import urlsplit, urlunsplit

_DEFAULT_PORTS = {"http": 80, "https": 443}


def normalize_url(url: str) -> str:
    """``url`` with scheme and host lower-cased, default port and fragment dropped.

    Raises ValueError for a URL ``urlsplit`` cannot read (a bad port).
    """
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    netloc = parts.netloc
    if netloc:
        userinfo, at, _hostport = netloc.rpartition("@")
        host = parts.hostname or ""
        port = parts.port
        if ":" in host:
            host = f"[{host}]"
        if port is not None and port != _DEFAULT_PORTS.get(scheme):
            host = f"{host}:{port}"
        netloc = f"{userinfo}{at}{host}"
    return urlunsplit((scheme, netloc, parts.path or ("/" if netloc else ""), parts.query, ""))


def url_key(url: str) -> str:
    """Cache key of an http(s) or file: image URL."""
    return "url:" + hashlib.sha256(normalize_url(url).encode("utf-8", "surrogatepass")).hexdigest()


def data_url_key(digest: str) -> str:
    """Cache key of a ``data:`` image from the hex SHA-256 of its decoded bytes."""
    return "img:" + digest


def session_scope_key(session_id: str) -> str:
    """The prefix that partitions one session's entries from every other session's."""
    return "s:" + hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:32] + ":"


def scope_key(
    key: str, *, session_scoping: bool, session_id: str | None, tenant_tag: str | None = None
) -> str | None:
    """The tier key for ``key``: in its tenant's space (``tenant_tag``, with API keys), and scoped
    by session when scoping is on; None means "bypass every tier" (scoping on and no session id:
    fetch from the origin, store nothing)."""
    if tenant_tag is not None:
        key = f"t:{tenant_tag}:{key}"
    if not session_scoping:
        return key
    if not session_id:
        return None
    return session_scope_key(session_id) + key
