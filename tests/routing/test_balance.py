"""Power of two choices: the less loaded of two random candidates."""

from __future__ import annotations

import random

from mmgate.routing.scheduling.balance import p2c_rank


def p2c_pick(loads: list[int], rng: random.Random) -> int:
    return p2c_rank(loads, rng)[0]


def test_two_candidates_always_the_less_loaded() -> None:
    rng = random.Random(1)
    assert {p2c_pick([5, 0], rng) for _ in range(100)} == {1}
    assert {p2c_pick([0, 5], rng) for _ in range(100)} == {0}


def test_equal_loads_spread() -> None:
    rng = random.Random(2)
    assert {p2c_pick([3, 3], rng) for _ in range(100)} == {0, 1}


def test_the_most_loaded_is_never_chosen_and_the_least_most_often() -> None:
    rng = random.Random(3)
    loads = [0, 4, 9]
    counts = [0, 0, 0]
    for _ in range(3000):
        counts[p2c_pick(loads, rng)] += 1
    assert counts[2] == 0
    # The least loaded wins every draw it is in (2 of 3 pairs): about 2000.
    assert counts[0] > counts[1] > 0


def test_single_and_empty() -> None:
    rng = random.Random(4)
    assert p2c_rank([7], rng) == [0]
    assert p2c_rank([], rng) == []


def test_rank_winner_first_then_by_load() -> None:
    rng = random.Random(5)
    for _ in range(50):
        rank = p2c_rank([4, 1, 3, 2], rng)
        assert sorted(rank) == [0, 1, 2, 3]
        rest = rank[1:]
        assert [([4, 1, 3, 2])[i] for i in rest] == sorted([4, 1, 3, 2][i] for i in rest)
    assert p2c_rank([], rng) == []
