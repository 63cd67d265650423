"""``RoutingPolicy`` runs the profile ``--routing`` names (``profiles``): its filters split the
fleet's backends into tiers (the kept ones, then their failovers), and each tier is scored and
ordered by the profile's picker within its bounds. Pure but for reading the fleet."""

from __future__ import annotations

import random
from collections.abc import Sequence

from mmgate.backends import Backend
from mmgate.config_routing import RoutingSettings
from mmgate.fleet import Fleet
from mmgate.fleet.holdings import BackendHoldings
from mmgate.routing.scheduling.parts import FILTERS, PICKERS, SCORERS, Decision, Request
from mmgate.routing.scheduling.profiles import PROFILES
from mmgate.routing.weights import RoutedImage


class RoutingPolicy:
    """The parts of the profile ``profile`` names (by default ``RoutingSettings.mode``)."""

    def __init__(self, settings: RoutingSettings, holdings: BackendHoldings, *, rng: random.Random,
                 profile: str | None = None) -> None:
        self.mode = settings.mode
        self.load_factor = settings.load_factor
        self.holdings = holdings
        self._rng = rng
        parts = PROFILES[profile or settings.mode]
        filters = [FILTERS[name] for name in parts.filters]
        self._splits = [f.split for f in filters if f.split is not None]
        self._bounds = [f.bound for f in filters if f.bound is not None]
        self._scorers = [SCORERS[name] for name in parts.scorers]
        self._picker = PICKERS[parts.picker]()

    def rank(self, fleet: Fleet, model: str, session_id: str | None, images: Sequence[RoutedImage]
             ) -> tuple[list[Backend], str | None]:
        """The fleet's backends in the order to try them, and the first one's reason (None: no candidate)."""
        tiers = [fleet.backends]
        for split in self._splits:
            tiers = [part for tier in tiers for part in split(tier, fleet, model) if part]
        order: list[Backend] = []
        reason = None
        for tier in tiers:
            decision = self.decide([b.name for b in tier], [fleet.outstanding(b) for b in tier], session_id, images)
            reason = reason or decision.reason
            order += [tier[i] for i in decision.order]
        return order, reason

    def decide(
        self, names: Sequence[str], loads: Sequence[int], session_id: str | None, images: Sequence[RoutedImage] = (),
    ) -> Decision:
        """The order to try one tier's ``names`` in and its reason; ``loads``: the requests in flight to each."""
        if not names:
            return Decision([], "least_loaded")
        unique = list({image.key: image for image in images}.values())  # an image shown twice counts once
        request = Request(names, loads, session_id, unique, self.holdings, self.load_factor, self._rng)
        scores = [(scorer, scorer.score(request)) for scorer in self._scorers] if unique else []
        return self._picker(request, scores, self._bounds)
