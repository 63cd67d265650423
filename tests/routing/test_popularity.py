"""Image popularity without sockets: decayed shares, replication with hysteresis, bounded memory."""

from __future__ import annotations

import pytest

from mmgate.routing.popularity import HYSTERESIS, MIN_SIGHTINGS, ImagePopularity


def test_share_is_the_fraction_of_requests_that_showed_the_image() -> None:
    p = ImagePopularity(0.5, half_life=1e9)
    for i in range(10):
        p.observe(["hot", f"own-{i}"] + (["half"] if i % 2 else []))
    assert p.share("hot") == pytest.approx(1.0)
    assert p.share("half") == pytest.approx(0.5)
    assert p.share("own-3") == pytest.approx(0.1)
    assert p.share("never") == 0.0
    p.observe(["twice", "twice"])  # an image twice in one request counts once
    assert p.count("twice") == pytest.approx(1.0)


def test_replicated_at_the_share_after_enough_sightings_then_with_hysteresis() -> None:
    p = ImagePopularity(0.3, half_life=1e9)
    for _ in range(MIN_SIGHTINGS - 1):
        p.observe(["hot"])
    assert p.share("hot") == 1.0 and not p.is_replicated("hot")  # too few sightings to tell
    p.observe(["hot"])
    assert p.is_replicated("hot") and p.replicated_count == 1
    # Its share falls below the threshold but stays above HYSTERESIS x it: still replicated...
    others = iter(range(10**6))
    while p.share("hot") >= 0.3:
        p.observe([f"other-{next(others)}"])
    assert p.share("hot") >= HYSTERESIS * 0.3
    assert p.is_replicated("hot")
    # ...and a newcomer at the same share is not (it never reached the threshold).
    fresh = ImagePopularity(0.3, half_life=1e9)
    for i in range(40):
        fresh.observe(["warm"] if i % 5 == 0 else ["x"])
    assert fresh.share("warm") == pytest.approx(0.2) and not fresh.is_replicated("warm")
    # Below the lower bound it is no longer replicated, and its next sighting records that.
    while p.share("hot") >= HYSTERESIS * 0.3:
        p.observe([f"other-{next(others)}"])
    assert not p.is_replicated("hot")
    p.observe(["hot"])
    assert not p.is_replicated("hot") and p.replicated_count == 0


def test_counts_decay_by_half_every_half_life() -> None:
    p = ImagePopularity(0.2, half_life=10)
    for _ in range(8):
        p.observe(["old"])
    before = p.count("old")
    for _ in range(10):
        p.observe(["new"])
    assert p.count("old") == pytest.approx(before / 2)
    for _ in range(200):
        p.observe(["new"])
    assert p.share("new") > 0.99 and p.share("old") < 0.01
    assert not p.is_replicated("old") and p.is_replicated("new")


def test_memory_is_bounded_by_keys_and_by_decay() -> None:
    p = ImagePopularity(0.2, half_life=1e9, max_keys=50)
    for i in range(1000):
        p.observe([f"k{i}", "hot"])
    assert len(p) == 50
    assert p.count("hot") == pytest.approx(1000)  # seen every request: never the oldest
    assert p.count("k0") == 0.0 and p.count("k999") == pytest.approx(1)
    # A key whose decayed count is negligible goes when it reaches the old end.
    q = ImagePopularity(0.2, half_life=5, max_keys=1000)
    for i in range(500):
        q.observe([f"k{i}"])
    assert len(q) < 50


def test_replicated_count_follows_evictions() -> None:
    p = ImagePopularity(0.2, half_life=1e9, max_keys=3)
    for _ in range(5):
        p.observe(["a"])
    assert p.replicated_count == 1
    for key in ("b", "c", "d"):
        p.observe([key])
    assert p.count("a") == 0.0 and p.replicated_count == 0


def test_bad_settings() -> None:
    for share in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError):
            ImagePopularity(share)
    with pytest.raises(ValueError):
        ImagePopularity(0.2, half_life=0)
    with pytest.raises(ValueError):
        ImagePopularity(0.2, max_keys=0)
