"""The LRU image history: bounded keys and holders, recency, forgetting a backend."""

from __future__ import annotations

import pytest

from mmgate.routing.history import ImageHistory


def test_records_holders_most_recent_last() -> None:
    h = ImageHistory(10)
    h.record("b0", ["k1", "k2"])
    h.record("b1", ["k1"])
    h.record("b0", ["k1"])
    assert h.holders("k1") == ("b1", "b0")
    assert h.holders("k2") == ("b0",)
    assert h.holds("k2", "b0") and not h.holds("k2", "b1")
    assert h.holders("nope") == ()


def test_bounded_by_keys_least_recent_out() -> None:
    h = ImageHistory(3)
    h.record("b0", ["a", "b", "c"])
    h.record("b0", ["a"])  # refreshes a
    h.record("b0", ["d"])
    assert len(h) == 3
    assert h.holders("b") == ()
    assert h.holders("a") == ("b0",)


def test_bounded_holders() -> None:
    h = ImageHistory(10, max_holders=2)
    for b in ("b0", "b1", "b2"):
        h.record(b, ["k"])
    assert h.holders("k") == ("b1", "b2")


def test_forget_backend() -> None:
    h = ImageHistory(10)
    h.record("b0", ["a", "b"])
    h.record("b1", ["a"])
    h.forget_backend("b0")
    assert h.holders("a") == ("b1",)
    assert h.holders("b") == ()
    assert len(h) == 2  # what is known about the images' sharing stays


def test_sharing_own_then_shared() -> None:
    h = ImageHistory(10)
    assert not h.is_shared("new", "s1")  # never seen: the request's own
    h.record("b0", ["a"], "s1")
    assert not h.is_shared("a", "s1")
    assert h.is_shared("a", "s2") and h.is_shared("a", None)
    h.record("b0", ["a"], "s1")
    assert not h.is_shared("a", "s1")
    h.record("b1", ["a"], "s2")
    assert h.is_shared("a", "s1")  # seen with two sessions: shared for everyone
    h.record("b0", ["n"], None)
    assert h.is_shared("n", "s1") and h.is_shared("n", None)


def test_bad_bounds() -> None:
    with pytest.raises(ValueError):
        ImageHistory(0)
