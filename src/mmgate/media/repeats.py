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

The fingerprint samples the URL's payload, the base64 after its comma, so that an Anthropic image
source's ``data`` (the payload alone: vLLM prefixes ``data:{media_type};base64,``) has the
fingerprint of the URL it stands for.

The parse can go one step earlier (``HeldImages``): a big string token of the raw body whose
sample matches a held image's fingerprint, in the request's own tenant and session space, is
confirmed against that image's URL (or, for a payload token, its payload) byte for byte
(``mmgate.jsonbody``) and parsed to the held ``str`` itself (a payload: a copy of the URL's tail,
the source's URL is then the held one, ``HeldImages.data_url``): the repeat's text is never
decoded to a new string, and the confirmation above is then an identity.
"""

from __future__ import annotations

from collections.abc import Callable

import xxhash

from mmgate.store import ByteLRU, LoadedImage

# The fingerprint's sample: the text's two ends and one character in every _STRIDE between (two
# screenshots differ all through their compressed data, so a sample tells them apart).
_EDGE = 4096
_STRIDE = 509
# How far into a data: URL its payload's comma is looked for (its type and parameters before it).
_HEAD = 256
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
    """XXH3-128 of the data: URL's payload (its text after the first comma within ``_HEAD``
    characters; all of it without one): its length, its first and last ``_EDGE`` characters and
    one in every ``_STRIDE`` between: a filter, not an identity (``forwards``), read without
    copying the text; None for non-ASCII text (which the SHA-256 path refuses)."""
    if not url.isascii():
        return None
    start = url.find(",", 0, _HEAD) + 1
    end = len(url)
    head_end = min(end, start + _EDGE)
    tail_start = max(start, end - _EDGE)
    sample = f"{end - start}:{url[start:head_end]}{url[head_end:tail_start:_STRIDE]}{url[tail_start:]}"
    return xxhash.xxh3_128_digest(sample.encode("ascii"))


def span_fingerprint(raw: bytes | bytearray, start: int, end: int) -> bytes:
    """``fingerprint`` of the text ``raw[start:end]`` (ASCII, as a data: URL's is), read from the
    bytes without decoding them: the same sample, so the same fingerprint."""
    comma = raw.find(b",", start, min(end, start + _HEAD))
    if comma >= 0:
        start = comma + 1
    head_end = min(end, start + _EDGE)
    tail_start = max(start, end - _EDGE)
    sample = b"".join((b"%d:" % (end - start), raw[start:head_end], raw[head_end:tail_start:_STRIDE],
                       raw[tail_start:end]))
    return xxhash.xxh3_128_digest(sample)


class HeldImages:
    """For ``mmgate.jsonbody``: the held text a big string token may be, in the request's tenant
    and session space (``scope``: a key → its tier key there). For a token that is a data: URL,
    the data URL of the image ``local`` holds under the key the index knows for the token's
    fingerprint; for a payload token (an Anthropic source's base64 ``data``), that URL's payload.
    Held URLs are built from a validated image's type and canonical base64, so they are printable
    ASCII with no ``\\`` or ``"``, as ``HeldText`` requires. One per request: it keeps the payloads it
    gave out (at most one per big string of the body) for ``data_url``."""

    def __init__(self, index: RepeatIndex, local: ByteLRU[str, LoadedImage],
                 scope: Callable[[str], str | None]) -> None:
        self._index, self._local, self._scope = index, local, scope
        self._payloads: dict[int, tuple[str, LoadedImage]] = {}  # id → (the payload given, its image)

    def __call__(self, raw: bytes | bytearray, start: int, end: int) -> str | None:
        image = _held_under(self._index, self._local, self._scope, span_fingerprint(raw, start, end))
        if image is None:
            return None
        url = image.data_url()
        if raw.startswith(b"data:", start):
            return url
        at = url.index(",") + 1
        if len(url) - at != end - start:
            return None  # not this payload: no copy made
        payload = url[at:]
        self._payloads[id(payload)] = (payload, image)
        return payload

    def data_url(self, media_type: object, data: object) -> str | None:
        """The held image's own data URL for an image source of ``media_type`` whose ``data`` is a
        payload given out here (the parse confirmed it byte for byte), when the image is of that
        type: the text ``data:{media_type};base64,{data}`` is, without building it. None: build it."""
        given = self._payloads.get(id(data))
        if given is None or given[0] is not data or given[1].mime != media_type:
            return None
        return given[1].data_url()


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
