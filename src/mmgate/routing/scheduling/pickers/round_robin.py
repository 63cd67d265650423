"""Picker ``round-robin``: rotates over the candidates, nothing else (a comparison mode)."""

from __future__ import annotations

import itertools

from mmgate.routing.scheduling.parts import PICKERS, Bound, Decision, Picker, Request, Scores, register


def round_robin() -> Picker:
    """A picker (one per policy) whose every request starts one candidate further than the last."""
    turns = itertools.count()

    def pick(request: Request, scores: Scores, bounds: list[Bound]) -> Decision:
        count = len(request.names)
        start = next(turns) % count
        return Decision([(start + i) % count for i in range(count)], "round_robin")

    return pick


register(PICKERS, "round-robin", round_robin)
