"""The scheduling's named parts and the profiles that combine them, the way llm-d's scheduler
registers its filters, scorers and pickers: each part registers under its name once, as its
module is imported; a profile names its parts; ``--routing`` names a profile. A new part is a
module and one registration (docs/ROUTING.md, "The parts"). The registries are filled at import
and never re-bound but by an explicit ``replace``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from mmgate.backends import Backend
from mmgate.routing.scheduling.request import Decision, Request

P = TypeVar("P")


class FleetView(Protocol):
    """What the filters read of the fleet (``mmgate.routing.fleet.Fleet``)."""

    def candidates(self, model: str) -> list[Backend]: ...
    def is_healthy(self, backend: Backend) -> bool: ...


# (candidates, fleet, model) -> (kept, failovers: ranked the same way, tried after the kept ones).
Split = Callable[[list[Backend], FleetView, str], tuple[list[Backend], list[Backend]]]
# (request, the picker's order) -> (the order to try, whether the choice moved off the best score).
Bound = Callable[[Request, list[int]], tuple[list[int], bool]]


@dataclass(frozen=True, slots=True)
class Filter:
    """Narrows the candidates before they are scored (``split``) or bounds the picker's choice (``bound``)."""

    split: Split | None = None
    bound: Bound | None = None


@dataclass(frozen=True, slots=True)
class Scorer:
    """Each candidate's pull toward a request. ``reason``: the decision's, when this is the first
    scorer of the profile that pulls the choice; ``tie_key``: a key whose rendezvous order breaks
    ties (None: none offered); ``stays``: when its pull at the choice is at least the other
    scorers' together, the request stays at the choice, unbounded, for this reason."""

    score: Callable[[Request], list[float]]
    reason: str
    tie_key: Callable[[Request], str | None] | None = None
    stays: bool = False


Scores = list[tuple[Scorer, list[float]]]


class Picker(Protocol):
    """Orders one request's candidates from its scores, then applies the profile's bounds."""

    def pick(self, request: Request, scores: Scores, bounds: list[Bound]) -> Decision: ...


@dataclass(frozen=True, slots=True)
class Profile:
    """Parts by name: filters (in order), scorers, a picker."""

    filters: tuple[str, ...]
    scorers: tuple[str, ...]
    picker: str


FILTERS: dict[str, Filter] = {}
SCORERS: dict[str, Scorer] = {}
PICKERS: dict[str, Callable[[], Picker]] = {}  # a factory: a picker may keep state (a turn)
PROFILES: dict[str, Profile] = {}


def register(registry: dict[str, P], name: str, part: P, *, replace: bool = False) -> P:
    """Add ``part`` as ``name``; a name taken already raises unless ``replace``."""
    if name in registry and not replace:
        raise ValueError(f"{name!r} is registered already")
    if isinstance(part, Profile):
        missing = [n for kind, names in ((FILTERS, part.filters), (SCORERS, part.scorers), (PICKERS, (part.picker,)))
                   for n in names if n not in kind]
        if missing:
            raise ValueError(f"profile {name!r} names unregistered parts: {missing}")
    registry[name] = part
    return part
