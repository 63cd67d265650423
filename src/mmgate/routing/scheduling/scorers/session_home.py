"""Scorer ``session-home``: a session's own images (``Request.own``) pull toward the session's
rendezvous home (a never-shown one ``NEW_IMAGE_SHARE`` of its weight: it is processed wherever
it goes, so only its later turns gain) and ``HELD_WEIGHT`` x their weight toward each candidate
holding them. It stays: when it pulls the choice at least as much as the other scorers, the
request stays there, unbounded (moving a conversation costs its images' processing again)."""

from __future__ import annotations

from mmgate.routing.scheduling.parts import SCORERS, Request, Scorer, register
from mmgate.routing.scheduling.scorers.image_held import HELD_WEIGHT

NEW_IMAGE_SHARE = 0.1


def session_pull(request: Request) -> list[float]:
    scores = [0.0] * len(request.names)
    home = request.session_home
    for image, own in zip(request.images, request.own, strict=True):
        if own and home is not None:
            scores[home] += (1.0 if request.holdings.knows(image.key) else NEW_IMAGE_SHARE) * image.weight
            for index in request.held_at(image.key):
                scores[index] += HELD_WEIGHT * image.weight
    return scores


register(SCORERS, "session-home", Scorer(session_pull, reason="session", stays=True))
