"""The routing-sync wire format (pure)."""

from __future__ import annotations

import json
from collections import deque

import pytest

from mmgate.routing.sync.peers import (
    MAX_EVENTS,
    MAX_KEY_CHARS,
    MAX_KEYS,
    MAX_MESSAGE_KEYS,
    InvalidSync,
    Routed,
    decode,
    encode,
    take,
)


def test_a_message_round_trips() -> None:
    routed = [Routed("vllm-1", 2**64 - 1, ("k1", "k2")), Routed("other", -1, ("k3",))]
    assert decode(encode(routed)) == routed


def test_take_and_encode_keep_each_message_within_its_bounds() -> None:
    pending = deque([Routed("vllm-0", 1, tuple(f"k{i}" for i in range(MAX_KEYS + 5)))] * (MAX_EVENTS + 3))
    message = decode(encode(take(pending)))
    assert len(message) == MAX_MESSAGE_KEYS // MAX_KEYS
    assert all(len(r.keys) == MAX_KEYS for r in message)
    pending = deque([Routed("vllm-0", 1, ("k",))] * (MAX_EVENTS + 3))
    assert len(decode(encode(take(pending)))) == MAX_EVENTS and len(pending) == 3


def _raw(**fields: object) -> bytes:
    body: dict[str, object] = {"v": 3, "s": [["vllm-0", 5, ["k"]]]}
    body.update(fields)
    return json.dumps(body).encode()


@pytest.mark.parametrize("data", [
    b"", b"\xff\xfe not utf-8", b"not json", b"[1, 2]", b"{}", b"[" * 100_000,
    _raw(v=2), _raw(v=4),
    _raw(s={}), _raw(s=[["vllm-0", True, ["k"]]]), _raw(s=[["vllm-0", 1.5, ["k"]]]), _raw(s=[["vllm-0", 5]]),
    _raw(s=[["vllm-0", "5", ["k"]]]), _raw(s=[["vllm-0", 2**64, ["k"]]]),
    _raw(s=[["vllm-0", -2, ["k"]]]), _raw(s=[["vllm-0", 5, "k"]]), _raw(s=[["vllm-0", 5, [""]]]),
    _raw(s=[["vllm-0", 5, ["x" * (MAX_KEY_CHARS + 1)]]]), _raw(s=[["vllm-0", 5, [1]]]),
    _raw(s=[["vllm-0", 5, ["k"] * (MAX_KEYS + 1)]]), _raw(s=[["vllm-0", 5, ["k"]]] * (MAX_EVENTS + 1)),
    _raw(s=[["vllm-0", 5, ["k"] * MAX_KEYS]] * (MAX_MESSAGE_KEYS // MAX_KEYS + 1)),
], ids=lambda d: repr(d[:40]))
def test_anything_that_is_not_a_message_is_refused_whole(data: bytes) -> None:
    with pytest.raises(InvalidSync):
        decode(data)
