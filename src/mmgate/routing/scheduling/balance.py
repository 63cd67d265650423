"""Least-outstanding choice by the power of two random choices (P2C).

Draw two distinct candidates at random and keep the one with fewer requests in flight. It avoids
the herd that "always the least loaded" causes when many requests arrive between two load updates,
and costs two reads whatever the number of backends. Pure: the caller passes the loads and the
random generator.
"""

from __future__ import annotations

import random
from collections.abc import Sequence


def p2c_rank(loads: Sequence[int], rng: random.Random) -> list[int]:
    """All indexes: the less loaded of two distinct random ones first (the first drawn on a tie),
    then the others by load (least first, stable)."""
    if len(loads) < 2:
        return list(range(len(loads)))
    a, b = rng.sample(range(len(loads)), 2)
    first = a if loads[a] <= loads[b] else b
    return [first, *sorted((i for i in range(len(loads)) if i != first), key=lambda i: loads[i])]
