"""Filter ``capacity``: bounded loads on the picker's order (consistent hashing with bounded loads,
Mirrokni et al.). A request that several backends could take without processing anything again
(``free_backends``) goes to the least loaded of them, which keeps room at the homes for requests
that can go nowhere else cheaply. Then no backend takes more than ``load_factor`` x the mean
requests in flight once the request is placed (``capacity``; this gateway's own requests, so each
gateway caps its own share): the request spills to the next backend of its order (``spill``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from mmgate.routing.scheduling.parts import FILTERS, Filter, Request, register


def free_backends(request: Request) -> list[int]:
    """Candidates where the request would process nothing it could avoid: each holds every image
    of it that was shown before (a never-shown image costs the same anywhere)."""
    free = set(range(len(request.names)))
    for image in request.images:
        if request.holdings.knows(image.key):
            free &= set(request.held_at(image.key))
    return sorted(free)


def capacity(loads: Sequence[int], load_factor: float) -> int:
    """Most requests one backend may hold once this one is placed: ``c (m+1) / n`` rounded down
    (max/mean within ``c`` at every moment), never below ``ceil((m+1) / n)``, so some backend
    always has room."""
    mean = (sum(loads) + 1) / len(loads)
    return max(math.ceil(mean), math.floor(load_factor * mean))


def spill(order: list[int], loads: Sequence[int], load_factor: float) -> tuple[list[int], bool]:
    """``order`` with its first backend under ``capacity`` moved to the front; True when that is
    not the preferred one (the request spilled over)."""
    cap = capacity(loads, load_factor)
    for position, index in enumerate(order):
        if loads[index] + 1 <= cap:
            if position == 0:
                return order, False
            return [index, *order[:position], *order[position + 1:]], True
    return order, False  # unreachable with load_factor >= 1: some backend is at or below the mean


def bounded(request: Request, order: list[int]) -> tuple[list[int], bool]:
    free = free_backends(request)
    if len(free) >= 2:
        best = min(free, key=lambda i: (request.loads[i], order.index(i)))
        order = [best, *(i for i in order if i != best)]
    return spill(order, request.loads, request.load_factor)


register(FILTERS, "capacity", Filter(bound=bounded))
