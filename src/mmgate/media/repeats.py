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

The parse can go one step earlier (``held_urls``): a big string token of the raw body whose
sample matches a held image's fingerprint, in the request's own tenant and session space, is
confirmed against that image's URL byte for byte (``mmgate.jsonbody``) and parsed to the held
``str`` itself: the repeat's text is never decoded to a new string, and the confirmation above
is then an identity.
"""

from __future__ import annotations

from collections.abc import Callable

import xxhash

from mmgate.jsonbody import HeldText
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


def span_fingerprint(raw: bytes | bytearray, start: int, end: int) -> bytes:
    """``fingerprint`` of the text ``raw[start:end]`` (ASCII, as a data: URL's is), read from the
    bytes without decoding them: the same sample, so the same fingerprint."""
    n = end - start
    head_end = min(end, start + _EDGE)
    tail_start = max(start, end - _EDGE)
    sample = b"".join((b"%d:" % n, raw[start:head_end], raw[head_end:tail_start:_STRIDE], raw[tail_start:end]))
    return xxhash.xxh3_128_digest(sample)


def held_urls(index: RepeatIndex, local: ByteLRU[str, LoadedImage], scope: Callable[[str], str | None]) -> HeldText:
    """For ``mmgate.jsonbody``: the data: URL of the image held in ``local`` under the tier key
    ``scope`` gives (the request's tenant and session space) for a token whose fingerprint the
    index knows. Held URLs are built from a validated image's type and canonical base64, so they
    are printable ASCII with no ``\\`` or ``"``, as ``HeldText`` requires."""

    def held(raw: bytes | bytearray, start: int, end: int) -> str | None:
        image = _held_under(index, local, scope, span_fingerprint(raw, start, end))
        return None if image is None else image.data_url()

    return held


def _held_under(index: RepeatIndex, local: ByteLRU[str, LoadedImage], scope: Callable[[str], str | None],
                mark: bytes | None) -> LoadedImage | None:
    """The image ``local`` holds under the key the index last recorded for ``mark``, in ``scope``'s space."""
    key = index.key(mark)
    tier_key = None if key is None else scope(key)
    return None if tier_key is None else local.get(tier_key)


def held_image(index: RepeatIndex, local: ByteLRU[str, LoadedImage], scope: Callable[[str], str | None], url: str,
               mark: bytes | None, max_bytes: int) -> LoadedImage | None:
    """The image ``local`` holds for the data: URL ``url`` (its ``fingerprint``: ``mark``) under
    the tier key ``scope`` gives, when it forwards this very URL (``forwards``) and is at most
    ``max_bytes``; None: take the parse, decode and SHA-256 path."""
    hit = _held_under(index, local, scope, mark)
    return hit if hit is not None and hit.num_bytes <= max_bytes and forwards(hit, url) else None


def forwards(image: LoadedImage, url: str) -> bool:
    """Whether ``image`` forwards exactly the data: URL ``url`` (its type and base64 text), so
    the text decodes to the image's bytes: the confirmation of a fingerprint match."""
    return image.data_url() == url
