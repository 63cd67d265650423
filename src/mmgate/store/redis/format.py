"""Pure pieces of the shared image cache tier: entry format, key names, metric buckets.

Nothing here does I/O or needs an event loop; ``mmgate.store.redis.tier`` wires it to Redis.

Entry layout (one Redis string per image; big-endian)::

    magic "MMGI" | version u8 | mime_len u8 | digest_len u8 | pad u8
    | width u32 | height u32 | payload_len u64 | crc32 u32
    | mime (ascii) | digest (ascii hex SHA-256) | payload (the encoded image bytes)

``crc32`` covers every header byte before it, the mime, the digest and the payload, so a flipped
bit anywhere is caught; ``payload_len`` catches truncation before any checksum work. CRC-32 is
an integrity check against accidental damage (truncated writes, a stray ``SET`` on the key), not
an authenticity check: anyone who can write to the cache could forge any unkeyed digest anyway.
It is the cheapest of the checks measured against SHA-256 and BLAKE2b (docs/PERFORMANCE.md,
"Image pipeline"). A hit never decodes the image: its bytes were validated before they were stored.
"""

from __future__ import annotations

import hashlib
import struct
import zlib

from mmgate.store.types import LoadedImage

ENTRY_MAGIC = b"MMGI"
ENTRY_VERSION = 1
_HEADER = struct.Struct(">4sBBBxIIQI")
HEADER_SIZE = _HEADER.size
# Bytes of the fixed header covered by the CRC (everything before the crc field itself).
_CRC_COVERED = HEADER_SIZE - 4
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
    )[:_CRC_COVERED]
    crc = zlib.crc32(image.data, zlib.crc32(digest, zlib.crc32(mime, zlib.crc32(fixed))))
    return b"".join((fixed, crc.to_bytes(4, "big"), mime, digest, image.data))


def decode_entry(raw: bytes) -> LoadedImage:
    """Check and unpack a stored entry; raise ``CorruptEntryError`` when it is damaged."""
    if len(raw) < HEADER_SIZE:
        raise CorruptEntryError(f"entry of {len(raw)} bytes is shorter than its header")
    magic, version, mime_len, digest_len, width, height, payload_len, crc = _HEADER.unpack_from(raw)
    if magic != ENTRY_MAGIC:
        raise CorruptEntryError("bad magic")
    if version != ENTRY_VERSION:
        raise CorruptEntryError(f"unknown entry version {version}")
    body_start = HEADER_SIZE + mime_len + digest_len
    if len(raw) != body_start + payload_len:
        raise CorruptEntryError(f"entry is {len(raw)} bytes, header says {body_start + payload_len}")
    view = memoryview(raw)
    try:
        actual = zlib.crc32(view[:_CRC_COVERED])
        actual = zlib.crc32(view[HEADER_SIZE:], actual)
    finally:
        view.release()
    if actual != crc:
        raise CorruptEntryError("checksum mismatch")
    try:
        mime = raw[HEADER_SIZE : HEADER_SIZE + mime_len].decode("ascii")
        digest = raw[HEADER_SIZE + mime_len : body_start].decode("ascii")
    except UnicodeDecodeError as exc:
        raise CorruptEntryError("mime or digest is not ascii") from exc
    return LoadedImage(data=raw[body_start:], mime=mime, width=width, height=height, digest=digest)


def entry_payload_size(raw: bytes) -> int | None:
    """The payload size a header announces (None when the header is unreadable)."""
    if len(raw) < HEADER_SIZE or raw[:4] != ENTRY_MAGIC:
        return None
    return int(_HEADER.unpack_from(raw)[6])
