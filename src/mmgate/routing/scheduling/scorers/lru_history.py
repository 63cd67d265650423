"""Scorer ``lru-history``: llm-d's multimodal cache scorer, a comparison baseline. Each candidate
scores the share of the request's image weight it is believed to hold (the record of holdings);
the ``lru-history`` profile adds the ``load`` scorer (llm-d's queue scorer), equally weighted. It
processes at least as many images as ``image-affinity`` on every workload of docs/ROUTING.md."""

from __future__ import annotations

from mmgate.routing.scheduling.parts import SCORERS, Request, Scorer, register


def held_share(request: Request) -> list[float]:
    held = [0.0] * len(request.names)
    for image in request.images:
        for index in request.held_at(image.key):
            held[index] += image.weight
    total = sum(image.weight for image in request.images) or 1.0
    return [weight / total for weight in held]


register(SCORERS, "lru-history", Scorer(held_share, reason="image_affinity"))
