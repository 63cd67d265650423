"""Filter ``model``: the candidates serving the request's model, in the fleet's model map (every
backend while none ever answered). The others are never tried; a model no backend serves raises
``ModelNotFoundError`` (``Fleet.candidates``)."""

from __future__ import annotations

from mmgate.backends import Backend
from mmgate.fleet import Fleet
from mmgate.routing.scheduling.parts import FILTERS, Filter, register


def serving(backends: list[Backend], fleet: Fleet, model: str) -> tuple[list[Backend], list[Backend]]:
    given = {id(b) for b in backends}
    return [b for b in fleet.candidates(model) if id(b) in given], []


register(FILTERS, "model", Filter(split=serving))
