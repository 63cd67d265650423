"""Scorer ``image-held``: each shared image (``Request.own``) pulls ``HELD_WEIGHT`` x its weight
toward every candidate believed to hold it (the record of holdings). Above 1, a holder beats the
image's home, so an image processed away from home draws its next requests there."""

from __future__ import annotations

from mmgate.routing.scheduling.parts import SCORERS, Request, Scorer, register

HELD_WEIGHT = 1.2


def held_pull(request: Request) -> list[float]:
    scores = [0.0] * len(request.names)
    for image, own in zip(request.images, request.own, strict=True):
        if not own:
            for index in request.held_at(image.key):
                scores[index] += HELD_WEIGHT * image.weight
    return scores


register(SCORERS, "image-held", Scorer(held_pull, reason="image_affinity"))
