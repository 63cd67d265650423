"""Image loading: URL policy (SSRF) → cache keys → loader (local LRU, in-flight dedup, shared
tier) → origin fetch. Storage itself lives in ``mmgate.store``."""

from mmgate.media.keys import normalize_url, scope_key, session_scope_key, url_key
from mmgate.media.loader import MediaLoader
from mmgate.media.url_policy import UrlPolicy, redact_url

__all__ = ["MediaLoader", "UrlPolicy", "normalize_url", "redact_url", "scope_key", "session_scope_key", "url_key"]
