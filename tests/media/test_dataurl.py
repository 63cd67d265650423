"""data: URLs: image types only, strict base64, size checked before decoding."""

from __future__ import annotations

import base64

import pytest

from mmgate.errors import ImageTooLargeError, UnsupportedImageError
from mmgate.media.dataurl import decode_payload, decoded_size, forwarded_as, parse_data_url


def test_parse_and_decode() -> None:
    raw = bytes(range(256)) * 3 + b"xy"
    url = "data:image/png;base64," + base64.b64encode(raw).decode()
    parsed = parse_data_url(url, max_bytes=10_000)
    assert parsed.mime == "image/png"
    assert parsed.num_bytes == len(raw)
    assert decode_payload(parsed) == raw


@pytest.mark.parametrize("n", range(1, 10))
def test_decoded_size_is_exact(n: int) -> None:
    assert decoded_size(base64.b64encode(b"x" * n).decode()) == n


def test_parameters_and_case_are_tolerated() -> None:
    parsed = parse_data_url("DATA:Image/JPEG;name=a.jpg;BASE64,AAAA", max_bytes=10)
    assert parsed.mime == "image/jpeg"


@pytest.mark.parametrize(
    "url",
    [
        "data:text/plain;base64,AAAA",
        "data:;base64,AAAA",
        "data:image/png,rawbytes",  # not base64
        "data:image/png;base64",  # no comma
        "data:application/octet-stream;base64,AAAA",
        "data:image/png;base64,",  # empty
        "data:image/png;base64,AAA",  # bad length
    ],
)
def test_refused_forms(url: str) -> None:
    with pytest.raises(UnsupportedImageError):
        parse_data_url(url, max_bytes=100)


@pytest.mark.parametrize("payload", ["AA AA", "AA\nA", "AA*A", "A===", "Ã€AA"])
def test_strict_base64(payload: str) -> None:
    parsed = parse_data_url("data:image/png;base64," + payload + "AAAA"[: (4 - len(payload) % 4) % 4],
                            max_bytes=100)
    with pytest.raises(UnsupportedImageError, match="base64"):
        decode_payload(parsed)


def test_size_is_checked_before_decoding() -> None:
    # Not valid base64 at all: a decode would fail with a base64 error. The size check fires first.
    url = "data:image/png;base64," + "*" * 4000
    with pytest.raises(ImageTooLargeError, match=r"2999|3000"):
        parse_data_url(url, max_bytes=2000)


def test_exact_limit_is_accepted() -> None:
    url = "data:image/png;base64," + base64.b64encode(b"x" * 300).decode()
    assert parse_data_url(url, max_bytes=300).num_bytes == 300
    with pytest.raises(ImageTooLargeError):
        parse_data_url(url, max_bytes=299)


def test_non_ascii_payload_is_refused() -> None:
    with pytest.raises(UnsupportedImageError, match="not valid base64"):
        decode_payload(parse_data_url("data:image/png;base64,\u00e9AAA", max_bytes=10))


def test_data_after_padding_is_refused() -> None:
    with pytest.raises(UnsupportedImageError):
        decode_payload(parse_data_url("data:image/png;base64,AA==AAAA", max_bytes=10))


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 100, 101, 102])
def test_the_canonical_url_is_the_one_forwarded(n: int) -> None:
    """``forwarded_as``: the client's URL is kept as the one to forward exactly when it is the
    text the gateway would write for the bytes (its type spelled so, canonical base64)."""
    raw = bytes(range(7, 7 + n))
    payload = base64.b64encode(raw).decode()
    url = "data:image/png;base64," + payload
    assert forwarded_as(url, "image/png", raw)
    assert not forwarded_as(url, "image/jpeg", raw)
    assert not forwarded_as("data:IMAGE/PNG;base64," + payload, "image/png", raw)
    assert not forwarded_as("data:image/png;name=a;base64," + payload, "image/png", raw)
    assert not forwarded_as(url, "image/png", raw + b"x")
    assert not forwarded_as(url, "image/png", raw[:-1] + bytes([raw[-1] ^ 1]))
    if n % 3:  # a padded last quartet: spare bits set spell the same bytes, not canonically
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
        last = payload.rstrip("=")
        odd = last[:-1] + alphabet[alphabet.index(last[-1]) | 1] + payload[len(last):]
        assert odd != payload and base64.b64decode(odd) == raw
        assert not forwarded_as("data:image/png;base64," + odd, "image/png", raw)
