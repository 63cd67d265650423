"""Filter ``health``: the healthy candidates; the ejected ones are their failovers, ranked the
same way after them (fail open: the health view may be stale, and a real attempt gives the client
the real error rather than a 503)."""

from __future__ import annotations

from mmgate.backends import Backend
from mmgate.fleet import Fleet
from mmgate.routing.scheduling.parts import FILTERS, Filter, register


def healthy(backends: list[Backend], fleet: Fleet, model: str) -> tuple[list[Backend], list[Backend]]:
    kept: list[Backend] = []
    ejected: list[Backend] = []
    for backend in backends:
        (kept if fleet.is_healthy(backend) else ejected).append(backend)
    return kept, ejected


register(FILTERS, "health", Filter(split=healthy))
