"""``lru-history``: the llm-d-like baseline routing, injected into ``mmgate serve`` for benchmarks.

Like llm-d's ``mm-cache-affinity-scorer``: each backend scores the share of the request's image
weight it holds (the gateway's ``BackendHoldings``) plus a load score, llm-d's queue scorer
(``(max - load) / (max - min)``), equally weighted; ties by the rendezvous order of the session,
else of the first image. A request without images goes by the ``session`` mode (the session's
home, else the less loaded of two). It is a comparison baseline, not a product mode: on every
workload of docs/ROUTING.md it processes at least as many images as ``image-affinity``.

    python benchmarks/lru_history.py serve --routing session --backend ...   # a gateway routing so

``benchmarks/image_affinity.py --modes lru-history`` starts its gateways this way.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import mmgate.routing.router as router_module
from mmgate.routing import Decision, RoutedImage, RoutingPolicy
from mmgate.routing.scheduling.policy import by_score

REASON = "image_history"


def load_scores(loads: Sequence[int]) -> list[float]:
    """llm-d's queue scorer: 1 for the least loaded, 0 for the most, linear between."""
    low, high = min(loads), max(loads)
    if high == low:
        return [1.0] * len(loads)
    return [(high - load) / (high - low) for load in loads]


class LruHistoryPolicy(RoutingPolicy):
    """The shipped policy's ``session`` mode, with requests that carry images scored llm-d's way."""

    def decide(
        self, names: Sequence[str], loads: Sequence[int], session_id: str | None, images: Sequence[RoutedImage] = (),
    ) -> Decision:
        images = list({image.key: image for image in images}.values())  # an image shown twice counts once
        if not names or not images:
            return super().decide(names, loads, session_id, images)
        total = sum(image.weight for image in images) or 1.0
        held = [sum(i.weight for i in images if self.holdings.holds(name, i.key)) / total for name in names]
        combined = [a + b for a, b in zip(held, load_scores(loads), strict=True)]
        order = by_score(combined, names, session_id or images[0].key)
        return Decision(order, REASON if held[order[0]] > 0 else "least_loaded")


def main() -> int:
    """``mmgate`` with every router built with ``LruHistoryPolicy`` (give it ``--routing session``)."""
    router_module.RoutingPolicy = LruHistoryPolicy  # type: ignore[misc]
    from mmgate.cli import main as mmgate_main

    return mmgate_main(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
