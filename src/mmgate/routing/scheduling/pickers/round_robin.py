"""Picker ``round-robin``: rotates over the candidates, nothing else (a comparison mode)."""

from __future__ import annotations

from mmgate.routing.scheduling.registry import PICKERS, Bound, Scores, register
from mmgate.routing.scheduling.request import Decision, Request


class RoundRobin:
    """Each request starts one candidate further than the last."""

    def __init__(self) -> None:
        self._turn = 0

    def pick(self, request: Request, scores: Scores, bounds: list[Bound]) -> Decision:
        count = len(request.names)
        start = self._turn % count
        self._turn += 1
        return Decision([(start + i) % count for i in range(count)], "round_robin")


register(PICKERS, "round-robin", RoundRobin)
