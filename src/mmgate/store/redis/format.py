"""Pure pieces of the shared image cache tier: entry format, key names, metric buckets.

Nothing here does I/O or needs an event loop; ``mmgate.store.redis.tier`` wires it to Redis.

Entry layout (one Redis string per image; big-endian)::

    magic "MMGI" | version u8 | mime_len u8 | digest_len u8 | pad u8
    | width u32 | height u32 | payload_len u64 | checksum u64
    | mime (ascii) | digest (ascii hex SHA-256) | payload (the encoded image bytes)

``checksum`` (XXH3-64) covers every header byte before it, the mime, the digest and the payload,
so a flipped bit anywhere is caught; ``payload_len`` catches truncation before any checksum work.
It is an integrity check against accidental damage (truncated writes, a stray ``SET`` on the
key), not an authenticity check: anyone who can write to the cache could forge any unkeyed digest
anyway. XXH3 is the cheapest check measured (a tenth of CRC-32's cost per MiB, which made a hit
cost a third more than the GET that fetched it; docs/PERFORMANCE.md, "Shared-tier hit"). Version 1
entries (the same layout with a CRC-32 in a u32) written by older gateways are still read. A hit
never decodes the image: its bytes were validated before they were stored.
"""

from __future__ import annotations

import hashlib
import struct
import zlib

import xxhash

from mmgate.store.types import LoadedImage

ENTRY_MAGIC = b"MMGI"
ENTRY_VERSION = 2
_HEADER = struct.Struct(">4sBBBxIIQQ")
HEADER_SIZE = _HEADER.size
# Bytes of the fixed header covered by the checksum (everything before the checksum field).
_COVERED = HEADER_SIZE - 8
# Version 1: the same fields with a CRC-32 (u32) as the checksum.
_HEADER_V1 = struct.Struct(">4sBBBxIIQI")
_MAX_U32 = 0xFFFFFFFF

KiB = 1024
MiB = 1024 * KiB

# (upper bound in bytes, label); a size above the last bound is "gt_32mib".
_SIZE_BUCKETS: tuple[tuple[int, str], ...] = (
    (64 * KiB, "le_64kib"),
    (256 * KiB, "le_256kib"),
    (1 * MiB, "le_1mib"),
    (4 * MiB, "le_4mib"),
    (16 * MiB, "le_16mib"),
    (32 * MiB, "le_32mib"),
)
SIZE_BUCKET_LABELS: tuple[str, ...] = (*(label for _, label in _SIZE_BUCKETS), "gt_32mib", "unknown")


class CorruptEntryError(ValueError):
    """A stored entry failed its checks (bad magic or version, truncated, checksum mismatch).

    Internal to the shared tier: the caller deletes the entry and reports a miss.
    """


def size_bucket(num_bytes: int | None) -> str:
    """The bounded ``size_bucket`` metric label of an entry of ``num_bytes`` (None: unknown)."""
    if num_bytes is None or num_bytes < 0:
        return "unknown"
    for bound, label in _SIZE_BUCKETS:
        if num_bytes <= bound:
            return label
    return "gt_32mib"


def entry_keys(prefix: str, key: str) -> tuple[str, str]:
    """The Redis keys ``(value_key, lease_key)`` of cache key ``key``.

    The cache key (a normalised URL, maybe session-scoped) is hashed: Redis keys stay short and
    bounded, and carry no URL. Both keys share one ``{hash tag}`` so, on Redis Cluster, an entry
    and its fill lease live on one slot and one Lua script can touch both.
    """
    tag = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{prefix}img:{{{tag}}}:v", f"{prefix}img:{{{tag}}}:lease"


def encode_entry(image: LoadedImage) -> bytes:
    """Serialise ``image`` with its header (one copy of the payload)."""
    mime = image.mime.encode("ascii")
    digest = image.digest.encode("ascii")
    if len(mime) > 255 or len(digest) > 255:
        raise ValueError("mime or digest longer than 255 bytes")
    if not (0 <= image.width <= _MAX_U32 and 0 <= image.height <= _MAX_U32):
        raise ValueError("width or height out of range")
    fixed = _HEADER.pack(
        ENTRY_MAGIC, ENTRY_VERSION, len(mime), len(digest), image.width, image.height,
        len(image.data), 0,
    )[:_COVERED]
    check = xxhash.xxh3_64(fixed)
    for part in (mime, digest, image.data):
        check.update(part)
    return b"".join((fixed, check.digest(), mime, digest, image.data))


def decode_entry(raw: bytes) -> LoadedImage:
    """Check and unpack a stored entry; raise ``CorruptEntryError`` when it is damaged."""
    if len(raw) < _HEADER_V1.size or raw[:4] != ENTRY_MAGIC:
        raise CorruptEntryError(f"entry of {len(raw)} bytes does not start with a header")
    version = raw[4]
    if version not in (1, ENTRY_VERSION):
        raise CorruptEntryError(f"unknown entry version {version}")
    header = _HEADER if version == ENTRY_VERSION else _HEADER_V1
    if len(raw) < header.size:
        raise CorruptEntryError(f"entry of {len(raw)} bytes is shorter than its header")
    _, _, mime_len, digest_len, width, height, payload_len, check = header.unpack_from(raw)
    body_start = header.size + mime_len + digest_len
    if len(raw) != body_start + payload_len:
        raise CorruptEntryError(f"entry is {len(raw)} bytes, header says {body_start + payload_len}")
    view = memoryview(raw)
    try:
        if version == ENTRY_VERSION:
            hasher = xxhash.xxh3_64(view[:_COVERED])
            hasher.update(view[HEADER_SIZE:])
            actual = hasher.intdigest()
        else:
            actual = zlib.crc32(view[header.size:], zlib.crc32(view[:header.size - 4]))
    finally:
        view.release()
    if actual != check:
        raise CorruptEntryError("checksum mismatch")
    try:
        mime = raw[header.size : header.size + mime_len].decode("ascii")
        digest = raw[header.size + mime_len : body_start].decode("ascii")
    except UnicodeDecodeError as exc:
        raise CorruptEntryError("mime or digest is not ascii") from exc
    return LoadedImage(data=raw[body_start:], mime=mime, width=width, height=height, digest=digest)


def entry_payload_size(raw: bytes) -> int | None:
    """The payload size a header announces (None when the header is unreadable)."""
    header = _HEADER if raw[4:5] == bytes((ENTRY_VERSION,)) else _HEADER_V1
    if len(raw) < header.size or raw[:4] != ENTRY_MAGIC:
        return None
    return int(header.unpack_from(raw)[6])
