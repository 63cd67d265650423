"""The routing-sync wire format and the other gateways' loads (pure)."""

from __future__ import annotations

import json

import pytest

from mmgate.routing.peers import (
    MAX_EVENTS,
    MAX_KEY_CHARS,
    MAX_KEYS,
    MAX_MESSAGE_BYTES,
    MAX_MESSAGE_KEYS,
    InvalidSync,
    PeerLoads,
    Routed,
    decode,
    encode,
)

NAMES = ("vllm-0", "vllm-1")


def test_a_message_round_trips_and_unknown_backends_are_dropped() -> None:
    routed = [Routed("vllm-1", 2**64 - 1, ("k1", "k2")), Routed("other", -1, ("k3",))]
    message = decode(encode({"vllm-0": 2, "vllm-1": 0, "other": 9}, routed), NAMES)
    assert message.loads == {"vllm-0": 2, "vllm-1": 0}
    assert message.routed == [Routed("vllm-1", 2**64 - 1, ("k1", "k2"))]


def test_encode_keeps_each_message_within_its_bounds() -> None:
    routed = [Routed("vllm-0", 1, tuple(f"k{i}" for i in range(MAX_KEYS + 5)))] * (MAX_EVENTS + 3)
    message = decode(encode({}, routed), NAMES)
    assert len(message.routed) == MAX_MESSAGE_KEYS // MAX_KEYS
    assert all(len(r.keys) == MAX_KEYS for r in message.routed)
    message = decode(encode({}, [Routed("vllm-0", 1, ("k",))] * (MAX_EVENTS + 3)), NAMES)
    assert len(message.routed) == MAX_EVENTS


def _raw(**fields: object) -> bytes:
    body: dict[str, object] = {"v": 2, "l": {"vllm-0": 1}, "s": [["vllm-0", 5, ["k"]]]}
    body.update(fields)
    return json.dumps(body).encode()


@pytest.mark.parametrize("data", [
    b"", b"\xff\xfe not utf-8", b"not json", b"[1, 2]", b"{}", b"[" * 100_000,
    _raw(v=1), _raw(v=3),
    _raw(l=[1]), _raw(l={"vllm-0": -1}), _raw(l={"vllm-0": True}), _raw(l={"vllm-0": 1.5}),
    _raw(l={"vllm-0": 10**7}), _raw(l={f"b{i}": 0 for i in range(300)}),
    _raw(s={}), _raw(s=[["vllm-0", 5]]), _raw(s=[["vllm-0", "5", ["k"]]]), _raw(s=[["vllm-0", 2**64, ["k"]]]),
    _raw(s=[["vllm-0", -2, ["k"]]]), _raw(s=[["vllm-0", 5, "k"]]), _raw(s=[["vllm-0", 5, [""]]]),
    _raw(s=[["vllm-0", 5, ["x" * (MAX_KEY_CHARS + 1)]]]), _raw(s=[["vllm-0", 5, [1]]]),
    _raw(s=[["vllm-0", 5, ["k"] * (MAX_KEYS + 1)]]), _raw(s=[["vllm-0", 5, ["k"]]] * (MAX_EVENTS + 1)),
    _raw(pad="x" * MAX_MESSAGE_BYTES), _raw(s=[["vllm-0", 5, ["k"] * MAX_KEYS]] * (MAX_MESSAGE_KEYS // MAX_KEYS + 1)),
], ids=lambda d: repr(d[:40]))
def test_anything_that_is_not_a_message_is_refused_whole(data: bytes) -> None:
    with pytest.raises(InvalidSync):
        decode(data, NAMES)


def test_peer_loads_count_until_their_age_runs_out() -> None:
    peers = PeerLoads(1.0)
    peers.update("a", {"vllm-0": 2}, now=10.0)
    peers.update("b", {"vllm-0": 3, "vllm-1": 1}, now=10.5)
    assert peers.total("vllm-0", 10.9) == 5 and peers.fresh(10.9) == 2
    assert peers.total("vllm-0", 11.2) == 3 and peers.fresh(11.2) == 1  # a's went stale
    peers.update("a", {"vllm-0": 0}, now=11.3)  # a snapshot replaces the last one
    assert peers.total("vllm-0", 11.4) == 3
    assert peers.total("vllm-1", 20.0) == 0


def test_peer_loads_keep_at_most_max_peers_the_longest_silent_out() -> None:
    peers = PeerLoads(100.0, max_peers=3)
    for i in range(5):
        peers.update(f"g{i}", {"vllm-0": 10**i}, now=float(i))
    peers.update("g2", {"vllm-0": 100}, now=5.0)  # g2 spoke again: g3 is now the longest silent
    peers.update("g5", {"vllm-0": 10**5}, now=6.0)
    assert peers.fresh(6.0) == 3
    assert peers.total("vllm-0", 6.0) == 10**4 + 100 + 10**5  # g4, g2, g5
    with pytest.raises(ValueError):
        PeerLoads(0)
