"""What a scheduling part reads (``Request``: one request and its candidates) and returns, and
where it registers: the way llm-d's scheduler registers its plugins, each part under its name,
once, as its module is imported; a profile names its parts; ``--routing`` names a profile
(docs/ROUTING.md, "The parts")."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TypeVar

from mmgate.backends import Backend
from mmgate.fleet import Fleet
from mmgate.fleet.holdings import BackendHoldings
from mmgate.routing.scheduling.rendezvous import rendezvous_pick
from mmgate.routing.weights import RoutedImage

# A decision's reason: a bounded metric label (mmgate_routing_decisions_total).
REASONS = ("round_robin", "session", "least_loaded", "image_affinity", "load_spill")


@dataclass(slots=True)
class Decision:
    """Indexes into the candidate list, best first, and the reason the first one won."""

    order: list[int]
    reason: str


@dataclass
class Request:
    """A request to place among ``names``, the backends of one filtered tier, with their ``loads``
    (requests in flight from this gateway); ``images``: each key once. What depends on the record
    of holdings is computed once, on first use. Pure."""

    names: Sequence[str]
    loads: Sequence[int]
    session_id: str | None
    images: Sequence[RoutedImage]
    holdings: BackendHoldings
    load_factor: float
    rng: random.Random

    @cached_property
    def session_home(self) -> int | None:
        """The session's rendezvous home among the candidates (None: no session)."""
        return rendezvous_pick(self.session_id, self.names) if self.session_id is not None else None

    @cached_property
    def own(self) -> list[bool]:
        """Per image: the session's own (shown by no other session, or never shown) or shared."""
        return [self.session_home is not None and not self.holdings.is_shared(i.key, self.session_id)
                for i in self.images]

    def held_at(self, key: str) -> list[int]:
        """The candidates believed to hold ``key``."""
        return [self.names.index(h) for h in self.holdings.holders(key) if h in self.names]


P = TypeVar("P")
# (candidates, fleet, model) -> (kept, failovers: ranked the same way, tried after the kept ones).
Split = Callable[[list[Backend], Fleet, str], tuple[list[Backend], list[Backend]]]
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
# Orders one request's candidates from its scores, then applies the profile's bounds.
Picker = Callable[[Request, Scores, list[Bound]], Decision]


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


def register(registry: dict[str, P], name: str, part: P) -> None:
    """Add ``part`` as ``name``; a name taken already raises."""
    if name in registry:
        raise ValueError(f"{name!r} is registered already")
    if isinstance(part, Profile):
        missing = [n for kind, names in ((FILTERS, part.filters), (SCORERS, part.scorers), (PICKERS, (part.picker,)))
                   for n in names if n not in kind]
        if missing:
            raise ValueError(f"profile {name!r} names unregistered parts: {missing}")
    registry[name] = part
