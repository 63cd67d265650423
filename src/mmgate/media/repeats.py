"""A repeated ``data:`` image found without SHA-256: the cheap half of an agent's turn.

An agent resends its screenshots every turn. The cache key of a ``data:`` URL is the SHA-256 of its
decoded bytes (``mmgate.media.keys``): ~90 µs for a 150 KB screenshot, three times a turn, on the
event loop. Here a repeat is found before the URL is even parsed, by XXH3-128 of a sample of its
text (its ends and one character in 509: ~1.4 µs, no copy), and **confirmed by comparing the
whole URL** with the one the held image forwards (a memory compare): a sample may collide, a
confirmed match cannot — equal base64 text decodes to equal bytes. Anything not confirmed (a first
sighting, an evicted image, another tenant's or session's entry, a client whose URL is not the
canonical one the gateway forwards: another spelling of the type, base64 that is not canonical)
takes the parse, decode and SHA-256 path, so keys, tiers and what a tenant can reach are
unchanged.

The index maps a fingerprint to the SHA-256 key it was last seen with; it is bounded by entries
and by the cache's TTL, and a stale entry costs only a failed confirmation.
"""

from __future__ import annotations

import xxhash

from mmgate.store import ByteLRU, LoadedImage

# The fingerprint's sample: the text's two ends and one character in every _STRIDE between (two
# screenshots differ all through their compressed data, so a sample tells them apart).
_EDGE = 4096
_STRIDE = 509
# Bookkeeping per entry (the 16-byte fingerprint, the 68-character key, the map's own): the
# index's byte budget is this times its entry cap.
_ENTRY_BYTES = 256


class RepeatIndex:
    """Fingerprint of a data: URL's base64 text → the unscoped cache key it was loaded under."""

    def __init__(self, max_entries: int, ttl_s: float | None) -> None:
        self._keys: ByteLRU[bytes, str] = ByteLRU(max_entries * _ENTRY_BYTES, lambda _key: _ENTRY_BYTES, ttl_s=ttl_s)

    def __len__(self) -> int:
        return len(self._keys)

    def key(self, fingerprint: bytes | None) -> str | None:
        """The key last recorded for ``fingerprint`` — a candidate only: confirm the hit with
        ``forwards_text``."""
        return None if fingerprint is None else self._keys.get(fingerprint)

    def remember(self, fingerprint: bytes | None, key: str) -> None:
        if fingerprint is not None:
            self._keys.put(fingerprint, key)


def fingerprint(url: str) -> bytes | None:
    """XXH3-128 of the data: URL's length, its first and last ``_EDGE`` characters and one in
    every ``_STRIDE`` between: a filter, not an identity (``forwards``), read without copying the
    text; None for non-ASCII text (which the SHA-256 path refuses)."""
    if not url.isascii():
        return None
    sample = f"{len(url)}:{url[:_EDGE]}{url[_EDGE:-_EDGE:_STRIDE]}{url[-_EDGE:]}"
    return xxhash.xxh3_128_digest(sample.encode("ascii"))


def forwards(image: LoadedImage, url: str) -> bool:
    """Whether ``image`` forwards exactly the data: URL ``url`` (its type and base64 text), so
    the text decodes to the image's bytes: the confirmation of a fingerprint match."""
    return image.data_url() == url
