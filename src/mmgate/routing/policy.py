"""Routing policies: the order in which to try a request's healthy backends, and why. Pure.

Modes (``--routing``):

* ``round-robin``    rotate over the healthy backends, nothing else;
* ``session``        the session's rendezvous home, else the less loaded of two random picks
                     (mmgate's routing before image affinity);
* ``lru-history``    like llm-d's ``mm-cache-affinity-scorer``: the share of the request's image
                     weight each backend was recently sent (``ImageHistory``, one gateway's memory),
                     plus a load score (``(max - load) / (max - min)``), equally weighted;
* ``image-affinity`` every image has a *home*, the rendezvous winner of its key over the healthy
                     backends, so every gateway process agrees with no shared state. A backend
                     scores the weight of the request's shared images it is home of (plus, with
                     ``held_weight``, of those it is believed to hold), and the session's home
                     scores ``session_weight`` x the weight of the session's own images (see
                     ``mmgate.routing.affinity``). With ``popularity`` (``ImagePopularity``), an
                     image shown in a large share of recent requests is *replicated*: it pulls
                     nowhere (held everywhere after one copy per backend), and the other pulls are
                     scaled by rarity (the rarer image's home wins). Ties go by the rendezvous order
                     of the rarest shared image that pulls, else the session's, else the first
                     image's: the same from every gateway, spills included. A request whose images
                     are all replicated and that has no session goes to the less loaded of two.

When shared images decide, ``image-affinity`` applies bounded loads (consistent hashing with
bounded loads, Mirrokni et al.): no backend may have more than ``c x (outstanding + 1) / n``
requests in flight once the request is placed (see ``bounded_capacity``); the request spills to
the next backend of its order. ``c >= 1`` guarantees one backend has room. With ``hold_overflow`` k, a request whose spill would
process images the preferred backend holds may stay there up to k requests over the cap (spill
only where it costs nothing, or where the preferred is truly full). The bound holds for
this gateway's own in-flight counts (several gateways each bound their share) and, when the
router polls the engines, for the fleet's (every gateway's load on each backend: see ``spill``). A decision made by the
session's own images stays at the session's home, as ``session`` routing would (a session's new
images beside a replicated one are bounded: otherwise a hot image's requests pile up by session).
With ``held_balance``, a request that several backends could take without processing anything
again (each holds, as far as this gateway sent them, all its seen non-replicated images:
``free_backends``) goes to the least loaded of them before the cap is applied: room stays at the
homes for the requests that have nowhere else to go cheaply.

A decision's ``reason`` is one of ``REASONS``, a bounded metric label.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from mmgate.routing.affinity import (
    NEW_IMAGE_SHARE,
    affinity_scores,
    free_backends,
    image_homes,
    unheld_weight,
)
from mmgate.routing.balance import p2c_rank
from mmgate.routing.history import ImageHistory
from mmgate.routing.popularity import ImagePopularity
from mmgate.routing.rendezvous import rendezvous_rank
from mmgate.routing.weights import RoutedImage

RoutingMode = Literal["round-robin", "session", "lru-history", "image-affinity"]
LoadRounding = Literal["down", "random"]
ROUTING_MODES: tuple[RoutingMode, ...] = ("round-robin", "session", "lru-history", "image-affinity")
__all__ = ["NEW_IMAGE_SHARE", "REASONS", "ROUTING_MODES", "Decision", "RoutingPolicy", "bounded_capacity",
           "fleet_capacity", "image_homes", "spill"]
REASONS = ("round_robin", "session", "least_loaded", "image_affinity", "image_history", "load_spill")


@dataclass(slots=True)
class Decision:
    """Indexes into the candidate list, best first, and the reason the first one won."""

    order: list[int]
    reason: str


def bounded_capacity(loads: Sequence[int], load_factor: float, draw: float | None = None) -> int:
    """Most requests one backend may hold once this one is placed: ``c (m+1) / n`` rounded down,
    or with ``draw`` (uniform in [0, 1)) rounded up with the probability of its fraction, so that
    the cap is ``c`` x the mean on average (randomised rounding: rounded down, 8 in flight on 4
    backends cap at 2.6 -> 2, the mean itself, and every request past perfect balance spills); never
    below ``ceil((m+1) / n)``, so some backend always has room. (Mirrokni et al. round up;
    rounding down keeps max/mean within ``c`` at every moment, rounding at random on average.)"""
    mean = (sum(loads) + 1) / len(loads)
    scaled = load_factor * mean
    cap = math.floor(scaled)
    if draw is not None and draw < scaled - cap:
        cap += 1
    return max(math.ceil(mean), cap)


def fleet_capacity(fleet: Sequence[int], load_factor: float) -> int:
    """``bounded_capacity`` for the fleet estimate: a poll-old figure is off by a request or so
    (one that ended, or one another gateway just sent), so one request of slack at small loads, or a
    finished request still in the reading would spill an idle fleet's next one."""
    mean = (sum(fleet) + 1) / len(fleet)
    return max(math.ceil(mean) + 1, math.floor(load_factor * mean))


def spill(
    order: list[int], loads: Sequence[int], load_factor: float, fleet: Sequence[int] | None = None,
    draw: float | None = None,
) -> tuple[list[int], bool]:
    """``order`` with its first backend under capacity moved to the front; True when that is not
    the preferred one (the request spilled over).

    With ``fleet`` (every gateway's load, as this one estimates it: ``mmgate.routing.load``) a
    backend must have room by both counts: this gateway's own (exact, but a G-th of the traffic)
    and the fleet's (all of it, but a poll old: one request of slack at small loads). When no
    backend has room by both, room by the fleet's count decides, then by the own count. ``draw``:
    the own cap's randomised rounding (``bounded_capacity``).
    """
    own_cap = bounded_capacity(loads, load_factor, draw)
    checks = [lambda i: loads[i] + 1 <= own_cap]
    if fleet is not None:
        fleet_cap = fleet_capacity(fleet, load_factor)
        checks = [lambda i: loads[i] + 1 <= own_cap and fleet[i] + 1 <= fleet_cap,
                  lambda i: fleet[i] + 1 <= fleet_cap, *checks]
    for has_room in checks:
        for position, index in enumerate(order):
            if has_room(index):
                if position == 0:
                    return order, False
                return [index, *order[:position], *order[position + 1:]], True
    return order, False  # unreachable with load_factor >= 1: some backend is at or below the mean


def history_scores(images: Sequence[RoutedImage], names: Sequence[str], history: ImageHistory) -> list[float]:
    """Share of the request's image weight each backend was recently sent (0..1)."""
    total = sum(image.weight for image in images)
    scores = [0.0] * len(names)
    if total <= 0:
        return scores
    for image in images:
        for holder in history.holders(image.key):
            if holder in names:
                scores[names.index(holder)] += image.weight / total
    return scores


def load_scores(loads: Sequence[int]) -> list[float]:
    """llm-d's queue scorer: 1 for the least loaded, 0 for the most, linear between."""
    low, high = min(loads), max(loads)
    if high == low:
        return [1.0] * len(loads)
    return [(high - load) / (high - low) for load in loads]


class RoutingPolicy:
    """One mode with its parameters; ``decide`` orders a list of healthy candidates."""

    def __init__(
        self, mode: RoutingMode = "session", *, load_factor: float = 1.3, session_weight: float = 1.0,
        held_weight: float = 0.0, history: ImageHistory | None = None, rng: random.Random | None = None,
        hold_overflow: int = 0, popularity: ImagePopularity | None = None, held_balance: bool = False,
        load_rounding: LoadRounding = "down",
    ) -> None:
        if mode not in ROUTING_MODES:
            raise ValueError(f"unknown routing mode {mode!r}")
        if load_factor < 1:
            raise ValueError("load_factor must be at least 1 (below it no backend may have room)")
        if hold_overflow < 0:
            raise ValueError("hold_overflow must not be negative")
        if load_rounding not in ("down", "random"):
            raise ValueError(f"unknown load rounding {load_rounding!r}")
        self.load_rounding = load_rounding
        self.hold_overflow = hold_overflow
        self.mode = mode
        self.load_factor = load_factor
        self.session_weight = session_weight
        self.held_weight = held_weight
        self.history = history if history is not None else ImageHistory()
        self.popularity = popularity
        self.held_balance = held_balance
        self._rng = rng if rng is not None else random.Random()
        self._turn = 0

    def decide(
        self, names: Sequence[str], loads: Sequence[int], session_id: str | None,
        images: Sequence[RoutedImage] = (), fleet_loads: Sequence[int] | None = None,
    ) -> Decision:
        """The order to try ``names`` in and its reason. ``loads``: this gateway's requests in
        flight to each; ``fleet_loads``: every gateway's, as estimated from the engines' own
        figures (None: unknown). Least-loaded choices use the fleet's when known; the bounded-load
        cap wants room by both."""
        count = len(names)
        own_loads = loads
        if fleet_loads is not None:
            loads = fleet_loads
        images = _unique(images)
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
        if self.mode == "lru-history":
            affinity = history_scores(images, names, self.history)
            load = load_scores(loads)
            combined = [a + b for a, b in zip(affinity, load, strict=True)]
            order = self._by_score(combined, names, session_id, images)
            return Decision(order, "image_history" if affinity[order[0]] > 0 else "least_loaded")
        scores = affinity_scores(
            images, names, session_id, self.history, session_weight=self.session_weight,
            held_weight=self.held_weight, popularity=self.popularity,
        )
        total = scores.total
        if session_id is None and scores.tie_key is None:
            # Every image is replicated (held everywhere, or soon): nothing pulls; balance.
            return Decision(p2c_rank(loads, self._rng), "least_loaded")
        order = self._by_score(total, names, session_id, images, scores.tie_key)
        first = order[0]
        conversation = scores.known_own or not scores.replicated
        if session_id is not None and scores.from_session[first] >= scores.from_images[first] and conversation:
            # The session's own images decided: stay at its home, as session routing does — moving a
            # conversation costs its images' processing again; sessions spread by rendezvous. (Only
            # new images and replicated ones: bounded below, or a hot image's turns pile up by session.)
            return Decision(order, "session")
        if self.held_balance:
            free = free_backends(images, names, self.history, self.popularity)
            if len(free) >= 2:
                # Several backends hold everything this request would process again: the least
                # loaded of them, which keeps room at the homes for requests that can go nowhere else.
                best = min(free, key=lambda i: (loads[i], order.index(i)))
                order = [best, *(i for i in order if i != best)]
        preferred = order
        draw = self._rng.random() if self.load_rounding == "random" else None
        order, spilled = spill(order, own_loads, self.load_factor, fleet_loads, draw)
        if spilled and self._overflow_saves(images, names, preferred[0], order[0], own_loads, fleet_loads):
            return Decision(preferred, "image_affinity")
        return Decision(order, "load_spill" if spilled else "image_affinity")

    def _overflow_saves(
        self, images: Sequence[RoutedImage], names: Sequence[str], preferred: int, spilled_to: int,
        loads: Sequence[int], fleet: Sequence[int] | None,
    ) -> bool:
        """True when the request may stay at ``preferred`` up to ``hold_overflow`` requests over the
        cap, because the backend it would spill to holds less of its images (it would process them
        again: a spill that costs nothing still happens)."""
        if self.hold_overflow == 0:
            return False
        if unheld_weight(images, names, spilled_to, self.history) <= unheld_weight(images, names, preferred, self.history):
            return False
        limit = bounded_capacity(loads, self.load_factor) + self.hold_overflow
        if loads[preferred] + 1 > limit:
            return False
        if fleet is not None:
            fleet_limit = fleet_capacity(fleet, self.load_factor) + self.hold_overflow
            return fleet[preferred] + 1 <= fleet_limit
        return True

    @staticmethod
    def _by_score(
        scores: Sequence[float], names: Sequence[str], session_id: str | None, images: Sequence[RoutedImage],
        image_key: str | None = None,
    ) -> list[int]:
        """Highest score first; ties by the session's (else ``image_key``'s, else the first image's)
        rendezvous order."""
        tie_key = image_key if image_key is not None else session_id if session_id is not None else images[0].key
        tie = {index: position for position, index in enumerate(rendezvous_rank(tie_key, names))}
        return sorted(range(len(names)), key=lambda i: (-scores[i], tie[i]))


def _unique(images: Sequence[RoutedImage]) -> list[RoutedImage]:
    """The request's images, each key once (an image shown twice is held or processed once)."""
    seen: dict[str, RoutedImage] = {}
    for image in images:
        seen.setdefault(image.key, image)
    return list(seen.values())
