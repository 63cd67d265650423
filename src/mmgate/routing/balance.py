"""Least-outstanding choice by the power of two random choices (P2C).

Draw two distinct candidates at random and keep the one with fewer requests in flight. It avoids
the herd that "always the least loaded" causes when many requests arrive between two load updates,
and costs two reads whatever the number of backends. Pure: the caller passes the loads and the
random generator.
"""

from __future__ import annotations

import random
from collections.abc import Sequence


def p2c_pick(loads: Sequence[int], rng: random.Random) -> int:
    """Index of the less loaded of two distinct random candidates (the first drawn on a tie)."""
    count = len(loads)
    if count == 0:
        raise ValueError("p2c_pick needs at least one candidate")
    if count == 1:
        return 0
    a, b = rng.sample(range(count), 2)
    return a if loads[a] <= loads[b] else b


def p2c_rank(loads: Sequence[int], rng: random.Random) -> list[int]:
    """All indexes, the P2C winner first, then the others by load (least first, stable)."""
    if not loads:
        return []
    first = p2c_pick(loads, rng)
    rest = sorted((i for i in range(len(loads)) if i != first), key=lambda i: loads[i])
    return [first, *rest]
