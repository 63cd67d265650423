"""Image loading: URL policy (SSRF) → cache keys → loader (local LRU, in-flight dedup, shared
tier) → origin fetch. Storage itself lives in ``mmgate.store``.

The face is loaded on first use (PEP 562): an image decode process imports
``mmgate.media.decode_worker``, and with it this package, before the gateway listens; importing the
loader here (aiohttp, redis, pydantic) made that ~0.5 s longer."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mmgate.media.keys import normalize_url, scope_key, session_scope_key, url_key
    from mmgate.media.loader import MediaLoader
    from mmgate.media.url_policy import UrlPolicy, redact_url

__all__ = ["MediaLoader", "UrlPolicy", "normalize_url", "redact_url", "scope_key", "session_scope_key", "url_key"]
_HOMES = {"MediaLoader": "loader", "UrlPolicy": "url_policy", "redact_url": "url_policy", "normalize_url": "keys",
          "scope_key": "keys", "session_scope_key": "keys", "url_key": "keys"}


def __getattr__(name: str) -> object:
    if name in _HOMES:
        return getattr(importlib.import_module(f"mmgate.media.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'mmgate.media' has no attribute {name!r}")
