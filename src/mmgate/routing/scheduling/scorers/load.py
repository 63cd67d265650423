"""Scorer ``load``: llm-d's queue scorer, 1 for the least loaded candidate, 0 for the most, linear
between (1 for all when their loads are equal)."""

from __future__ import annotations

from collections.abc import Sequence

from mmgate.routing.scheduling.parts import SCORERS, Scorer, register


def load_scores(loads: Sequence[int]) -> list[float]:
    low, high = min(loads), max(loads)
    if high == low:
        return [1.0] * len(loads)
    return [(high - load) / (high - low) for load in loads]


register(SCORERS, "load", Scorer(lambda request: load_scores(request.loads), reason="least_loaded"))
