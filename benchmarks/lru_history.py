"""``lru-history``: the llm-d-like baseline routing, a scorer registered here and a profile that
names it, run by ``mmgate serve`` for benchmarks.

Like llm-d's ``mm-cache-affinity-scorer``: each backend scores the share of the request's image
weight it holds (the gateway's ``BackendHoldings``), and the routing's ``load`` scorer adds llm-d's
queue scorer (``(max - load) / (max - min)``), equally weighted; the ``highest-score`` picker breaks
ties by the rendezvous order of the session, else of the first image. A request without images
goes to the session's home, else to the less loaded of two. It is a comparison baseline, not a
product profile: on every workload of docs/ROUTING.md it processes at least as many images as
``image-affinity``.

    python benchmarks/lru_history.py serve --routing session --backend ...   # a gateway routing so

``benchmarks/image_affinity.py --modes lru-history`` starts its gateways this way.
"""

from __future__ import annotations

import random
import sys

from mmgate.config_routing import RoutingSettings
from mmgate.routing import BackendHoldings, RoutingPolicy
from mmgate.routing.scheduling import PROFILES, SCORERS, Profile, Request, Scorer, register

NAME = "lru-history"
REASON = "image_history"


def held_share(request: Request) -> list[float]:
    """Per candidate, the share of the request's image weight it holds."""
    total = sum(image.weight for image in request.images) or 1.0
    return [sum(i.weight for i in request.images if request.holdings.holds(name, i.key)) / total
            for name in request.names]


register(SCORERS, NAME, Scorer(held_share, reason=REASON))
register(PROFILES, NAME, Profile(("model", "health"), (NAME, "load"), "highest-score"))


class LruHistoryPolicy(RoutingPolicy):
    """The ``lru-history`` profile, whatever the settings' mode."""

    def __init__(self, settings: RoutingSettings, holdings: BackendHoldings, *, rng: random.Random) -> None:
        super().__init__(settings, holdings, rng=rng, profile=NAME)


def main() -> int:
    """``mmgate`` whose ``--routing session`` runs the ``lru-history`` profile: the settings take only
    the shipped profiles' names, so this program binds that name to its own profile."""
    register(PROFILES, "session", PROFILES[NAME], replace=True)
    from mmgate.cli import main as mmgate_main

    return mmgate_main(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
