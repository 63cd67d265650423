"""Scorer ``image-home``: each shared image (shown by another session, or without one) pulls its
weight toward its home, the rendezvous winner of its key, so every gateway agrees with no shared
state. Ties go by the rendezvous order of the request's first shared image."""

from __future__ import annotations

from mmgate.routing.scheduling.parts import SCORERS, Request, Scorer, register
from mmgate.routing.scheduling.rendezvous import rendezvous_pick


def home_pull(request: Request) -> list[float]:
    scores = [0.0] * len(request.names)
    for image, own in zip(request.images, request.own, strict=True):
        if not own:
            scores[rendezvous_pick(image.key, request.names)] += image.weight
    return scores


def first_shared(request: Request) -> str | None:
    return next((i.key for i, own in zip(request.images, request.own, strict=True) if not own), None)


register(SCORERS, "image-home", Scorer(home_pull, reason="image_affinity", tie_key=first_shared))
