"""One request as the scheduling's parts see it, and the decision they make. Pure.

The candidates are the backends of one filtered tier, by name, with their loads (requests in
flight from this gateway). What depends on the record of holdings is computed once, on first use.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from mmgate.routing.holdings import BackendHoldings
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
    """A request to place among ``names``; ``images``: each key once."""

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
