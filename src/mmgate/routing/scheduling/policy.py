"""Routing policies: the order in which to try a request's healthy backends, and why. Pure.

Modes (``RoutingSettings.mode``, ``--routing``):

* ``round-robin``    rotate over the healthy backends, nothing else;
* ``session``        the session's rendezvous home, else the less loaded of two random picks;
* ``image-affinity`` (the default) each image of the request pulls its weight toward backends
  (``affinity_scores``): a shared image (shown by another session, or without one) toward its
  *home*, the rendezvous winner of its key, so every gateway agrees with no shared state; a
  session's own image toward the session's home (a never-shown one ``NEW_IMAGE_SHARE`` of its
  weight: it is processed wherever it goes); and ``HELD_WEIGHT`` (above 1) x its weight toward
  each backend that holds it, so an image processed away from home draws its next requests there.

  Ties go by the rendezvous order of the first shared image, else the session's, else the first
  image's: the same from every gateway. When the session's own images decide, the request stays
  at the session's home (moving a conversation costs its images' processing again). A request
  that several backends could take without processing anything again (``free_backends``) goes to
  the least loaded of them, which keeps room at the homes for requests that can go nowhere else
  cheaply. Then bounded loads apply (consistent hashing with bounded loads, Mirrokni et al.): no
  backend above ``load_factor`` x the mean requests in flight once the request is placed
  (``capacity``), this gateway's own requests (each gateway caps its own share); the request
  spills to the next backend of its order (``spill``).

A decision's ``reason`` is one of ``REASONS``, a bounded metric label.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from mmgate.config_routing import RoutingSettings
from mmgate.routing.holdings import BackendHoldings
from mmgate.routing.scheduling.balance import p2c_rank
from mmgate.routing.scheduling.rendezvous import rendezvous_pick, rendezvous_rank
from mmgate.routing.weights import RoutedImage

__all__ = ["HELD_WEIGHT", "NEW_IMAGE_SHARE", "REASONS", "Decision", "RoutingPolicy", "affinity_scores", "by_score",
           "capacity", "free_backends", "spill"]
REASONS = ("round_robin", "session", "least_loaded", "image_affinity", "load_spill")
# A backend holding an image pulls this x its weight: above 1, a holder beats the image's home.
HELD_WEIGHT = 1.2
# A never-shown image of a session pulls this share of its weight toward the session's home: it is
# processed wherever it goes, so only its later turns gain from the placement.
NEW_IMAGE_SHARE = 0.1


@dataclass(slots=True)
class Decision:
    """Indexes into the candidate list, best first, and the reason the first one won."""

    order: list[int]
    reason: str


@dataclass(slots=True)
class AffinityScores:
    """Each backend's pull for one request: ``from_session`` (the session's own images at the
    session's home and where they are held), ``from_images`` (shared images at their homes and
    where they are held); ``tie_key``: the first shared image's key (None: no shared image)."""

    from_session: list[float]
    from_images: list[float]
    tie_key: str | None

    @property
    def total(self) -> list[float]:
        return [a + b for a, b in zip(self.from_session, self.from_images, strict=True)]


def affinity_scores(
    images: Sequence[RoutedImage], names: Sequence[str], session_id: str | None, holdings: BackendHoldings,
) -> AffinityScores:
    """Each backend's ``image-affinity`` pull for ``images`` (see the module docstring)."""
    scores = AffinityScores([0.0] * len(names), [0.0] * len(names), None)
    session_home = rendezvous_pick(session_id, names) if session_id is not None else None
    for image in images:
        own = session_home is not None and not holdings.is_shared(image.key, session_id)
        if own:
            share = 1.0 if holdings.knows(image.key) else NEW_IMAGE_SHARE
            scores.from_session[session_home] += share * image.weight  # type: ignore[index]
        else:
            scores.from_images[rendezvous_pick(image.key, names)] += image.weight
            if scores.tie_key is None:
                scores.tie_key = image.key
        pulls = scores.from_session if own else scores.from_images
        for holder in holdings.holders(image.key):
            if holder in names:
                pulls[names.index(holder)] += HELD_WEIGHT * image.weight
    return scores


def free_backends(images: Sequence[RoutedImage], names: Sequence[str], holdings: BackendHoldings) -> list[int]:
    """Backends where the request would process nothing it could avoid: each holds every image
    of it that was shown before (a never-shown image costs the same anywhere)."""
    free = set(range(len(names)))
    for image in images:
        if holdings.knows(image.key):
            free &= {names.index(h) for h in holdings.holders(image.key) if h in names}
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


def by_score(scores: Sequence[float], names: Sequence[str], tie_key: str) -> list[int]:
    """Indexes of ``names``, highest score first; ties by ``tie_key``'s rendezvous order."""
    tie = {index: position for position, index in enumerate(rendezvous_rank(tie_key, names))}
    return sorted(range(len(names)), key=lambda i: (-scores[i], tie[i]))


class RoutingPolicy:
    """The configured mode (``RoutingSettings``); ``decide`` orders a list of healthy candidates."""

    def __init__(self, settings: RoutingSettings, holdings: BackendHoldings, *, rng: random.Random) -> None:
        self.mode = settings.mode
        self.load_factor = settings.load_factor
        self.holdings = holdings
        self._rng = rng
        self._turn = 0

    def decide(
        self, names: Sequence[str], loads: Sequence[int], session_id: str | None, images: Sequence[RoutedImage] = (),
    ) -> Decision:
        """The order to try ``names`` in and its reason; ``loads``: the requests in flight to each."""
        count = len(names)
        if images:
            images = list({image.key: image for image in images}.values())  # an image shown twice counts once
        if count == 0:
            return Decision([], "least_loaded")
        if self.mode == "round-robin":
            start = self._turn % count
            self._turn += 1
            return Decision([(start + i) % count for i in range(count)], "round_robin")
        if self.mode == "session" or not images:
            if session_id is not None:
                return Decision(rendezvous_rank(session_id, names), "session")
            return Decision(p2c_rank(loads, self._rng), "least_loaded")
        scores = affinity_scores(images, names, session_id, self.holdings)
        tie_key = scores.tie_key or session_id or images[0].key
        order = by_score(scores.total, names, tie_key)
        first = order[0]
        if session_id is not None and scores.from_session[first] >= scores.from_images[first]:
            return Decision(order, "session")
        free = free_backends(images, names, self.holdings)
        if len(free) >= 2:
            best = min(free, key=lambda i: (loads[i], order.index(i)))
            order = [best, *(i for i in order if i != best)]
        order, spilled = spill(order, loads, self.load_factor)
        return Decision(order, "load_spill" if spilled else "image_affinity")
