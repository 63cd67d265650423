"""Pure parts of the shared tier: entry format, keys, size buckets."""

from __future__ import annotations

import hashlib
import os
import struct
import zlib

import pytest

from mmgate.store.redis.format import (
    HEADER_SIZE,
    SIZE_BUCKET_LABELS,
    CorruptEntryError,
    decode_entry,
    encode_entry,
    entry_keys,
    entry_payload_size,
    size_bucket,
)
from mmgate.store.types import LoadedImage

KiB = 1024
MiB = 1024 * KiB


def _image(num_bytes: int = 4096) -> LoadedImage:
    data = os.urandom(num_bytes)
    return LoadedImage(data=data, mime="image/png", width=640, height=480,
                       digest=hashlib.sha256(data).hexdigest())


def test_round_trip_keeps_every_field() -> None:
    image = _image()
    back = decode_entry(encode_entry(image))
    assert (back.data, back.mime, back.width, back.height, back.digest) == (
        image.data, image.mime, image.width, image.height, image.digest)
    assert entry_payload_size(encode_entry(image)) == len(image.data)


def test_empty_payload_round_trips() -> None:
    image = LoadedImage(data=b"", mime="image/gif", width=1, height=1, digest="0" * 64)
    assert decode_entry(encode_entry(image)).data == b""


@pytest.mark.parametrize("offset", [0, 5, 9, 13, 20, HEADER_SIZE - 1, HEADER_SIZE + 3, -1, -2048])
def test_any_flipped_byte_is_detected(offset: int) -> None:
    raw = bytearray(encode_entry(_image()))
    raw[offset] ^= 0x01
    with pytest.raises(CorruptEntryError):
        decode_entry(bytes(raw))


@pytest.mark.parametrize("keep", [0, 3, HEADER_SIZE - 1, HEADER_SIZE + 10, -1, -1000])
def test_truncated_entry_is_detected(keep: int) -> None:
    raw = encode_entry(_image())
    with pytest.raises(CorruptEntryError):
        decode_entry(raw[:keep])


def test_extra_trailing_bytes_are_detected() -> None:
    with pytest.raises(CorruptEntryError):
        decode_entry(encode_entry(_image()) + b"x")


def test_unknown_version_is_rejected() -> None:
    raw = bytearray(encode_entry(_image()))
    raw[4] = 99
    with pytest.raises(CorruptEntryError, match="version"):
        decode_entry(bytes(raw))


def test_foreign_value_is_rejected() -> None:
    with pytest.raises(CorruptEntryError):
        decode_entry(b"\x89PNG\r\n\x1a\n" + b"\0" * 100)
    assert entry_payload_size(b"not ours") is None


def test_header_limits() -> None:
    with pytest.raises(ValueError):
        encode_entry(LoadedImage(data=b"x", mime="image/" + "x" * 300, width=1, height=1, digest="d"))
    with pytest.raises(ValueError):
        encode_entry(LoadedImage(data=b"x", mime="image/png", width=2**32, height=1, digest="d"))


def test_entry_keys_share_a_hash_tag_and_hide_the_url() -> None:
    url = "https://example.com/a/{weird}/image.png?token=secret"
    value_key, lease_key = entry_keys("mmgate:", url)
    assert value_key.startswith("mmgate:") and lease_key.startswith("mmgate:")
    assert value_key != lease_key
    tag = value_key[value_key.index("{") + 1 : value_key.index("}")]
    assert tag == lease_key[lease_key.index("{") + 1 : lease_key.index("}")]
    assert len(tag) == 64
    assert "example.com" not in value_key and "secret" not in lease_key
    assert entry_keys("mmgate:", url + "x")[0] != value_key
    assert entry_keys("other:", url)[0] != value_key


@pytest.mark.parametrize(
    ("num_bytes", "label"),
    [
        (None, "unknown"), (-1, "unknown"), (0, "le_64kib"), (64 * KiB, "le_64kib"),
        (64 * KiB + 1, "le_256kib"), (256 * KiB, "le_256kib"), (MiB, "le_1mib"),
        (MiB + 1, "le_4mib"), (4 * MiB, "le_4mib"), (16 * MiB, "le_16mib"),
        (32 * MiB, "le_32mib"), (32 * MiB + 1, "gt_32mib"), (10**12, "gt_32mib"),
    ],
)
def test_size_bucket(num_bytes: int | None, label: str) -> None:
    assert size_bucket(num_bytes) == label
    assert label in SIZE_BUCKET_LABELS


def test_size_bucket_labels_are_bounded() -> None:
    assert len(SIZE_BUCKET_LABELS) == 8
    assert {size_bucket(n) for n in range(0, 64 * MiB, 97 * KiB)} <= set(SIZE_BUCKET_LABELS)


def _version1_entry(image: LoadedImage) -> bytes:
    """An entry as gateways before XXH3 wrote it: a CRC-32 (u32) over the same bytes."""
    mime, digest = image.mime.encode(), image.digest.encode()
    fixed = struct.pack(">4sBBBxIIQ", b"MMGI", 1, len(mime), len(digest), image.width, image.height,
                        len(image.data))
    crc = zlib.crc32(image.data, zlib.crc32(digest, zlib.crc32(mime, zlib.crc32(fixed))))
    return fixed + struct.pack(">I", crc) + mime + digest + image.data


def test_version1_entries_are_still_read_and_checked() -> None:
    image = _image()
    raw = _version1_entry(image)
    back = decode_entry(raw)
    assert (back.data, back.mime, back.width, back.height, back.digest) == (
        image.data, image.mime, image.width, image.height, image.digest)
    assert entry_payload_size(raw) == len(image.data)
    damaged = bytearray(raw)
    damaged[-7] ^= 0x10
    with pytest.raises(CorruptEntryError, match="checksum"):
        decode_entry(bytes(damaged))


def test_new_entries_carry_the_current_version() -> None:
    raw = encode_entry(_image())
    assert raw[4] == 2 and len(raw) == HEADER_SIZE + len("image/png") + 64 + 4096
