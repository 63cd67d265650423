"""What ``image-affinity`` weighs per backend: image homes, held images, the session, popularity. Pure.

Every image has a *home*, the rendezvous winner of its key over the healthy backends, so every
gateway agrees with no shared state. A request's images pull toward backends:

* a session's own image (seen only with this session: ``ImageHistory.is_shared``) pulls at the
  session's home (``session_weight`` x its weight; a never-seen one ``NEW_IMAGE_SHARE`` of that:
  it is processed wherever it goes);
* a shared image (seen with another session, or without one) pulls at its home;
* every image also pulls ``held_weight`` x its weight at each backend this gateway sent it to
  (above 1, the gateway default 1.2: a holder beats the home, so once an image was processed away
  from its home — a spill, or a request another image decided — its requests follow it there
  instead of processing it again at home);
* a *replicated* image (``ImagePopularity``: shown in a large share of recent requests) pulls
  nowhere: it is expected on every backend after one copy each, so its requests go by their
  other images' homes and its own home takes no more than its share of them.

With popularity known, each pull is also scaled by the image's rarity (``rarity``: 2 for an image
never seen before, 1 at the replication threshold): when a request's images have different homes,
the rarer one's home wins and the more popular image is copied there — that one is on its way to
being held everywhere anyway, where a rare image copied away from its home is processed again
for nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mmgate.routing.history import ImageHistory
from mmgate.routing.popularity import ImagePopularity
from mmgate.routing.rendezvous import rendezvous_rank, rendezvous_score
from mmgate.routing.weights import RoutedImage

# A never-seen image of a session pulls this share of a known own image toward the session home:
# it must be processed wherever it goes, so only its later turns gain from the placement.
NEW_IMAGE_SHARE = 0.1


@dataclass(slots=True)
class AffinityScores:
    """Each backend's pull, by where it comes from, for one request.

    ``from_session``: the session's own images at the session's home; ``from_images``: image homes
    and holders; ``known_own``: some own image pulling was seen before (a conversation, not only
    its new images); ``replicated``: the request showed an image that pulled nowhere (replicated).
    ``tie_key``: the key whose rendezvous order breaks ties (the rarest pulling image's).
    """

    from_session: list[float]
    from_images: list[float]
    known_own: bool
    replicated: bool
    tie_key: str | None

    @property
    def total(self) -> list[float]:
        return [a + b for a, b in zip(self.from_session, self.from_images, strict=True)]


def image_homes(images: Sequence[RoutedImage], names: Sequence[str]) -> list[int]:
    """The home (index into ``names``) of each image: the rendezvous winner of its key."""
    homes = []
    for image in images:
        best, best_score = 0, -1
        for i, name in enumerate(names):
            score = rendezvous_score(image.key, name)
            if score > best_score:
                best, best_score = i, score
        homes.append(best)
    return homes


def rarity(popularity: ImagePopularity | None, key: str) -> float:
    """2 for an image never seen, falling to 1 at the replication share (1 without popularity)."""
    if popularity is None:
        return 1.0
    return 2.0 - min(1.0, popularity.share(key) / popularity.replicate_share)


def affinity_scores(
    images: Sequence[RoutedImage], names: Sequence[str], session_id: str | None,
    history: ImageHistory | None, *, session_weight: float, held_weight: float,
    popularity: ImagePopularity | None = None,
) -> AffinityScores:
    """Each backend's ``image-affinity`` pull for ``images`` (see the module docstring)."""
    scores = AffinityScores([0.0] * len(names), [0.0] * len(names), False, False, None)
    session_home = rendezvous_rank(session_id, names)[0] if session_id is not None else None
    rarest = -1.0
    for image, home in zip(images, image_homes(images, names), strict=True):
        if popularity is not None and popularity.is_replicated(image.key):
            scores.replicated = True
            continue
        factor = rarity(popularity, image.key)
        weight = factor * image.weight
        own = False
        if session_home is not None and history is not None and not history.is_shared(image.key, session_id):
            own = True
            known = history.knows(image.key)
            scores.known_own |= known
            share = 1.0 if known else NEW_IMAGE_SHARE
            scores.from_session[session_home] += share * session_weight * weight
        else:
            scores.from_images[home] += weight
            if factor > rarest:
                rarest, scores.tie_key = factor, image.key
        if history is not None and held_weight > 0:
            # Where a session's own image is held pulls for the session (its conversation follows it).
            pulls = scores.from_session if own else scores.from_images
            for holder in history.holders(image.key):
                if holder in names:
                    pulls[names.index(holder)] += held_weight * weight
    return scores


def free_backends(
    images: Sequence[RoutedImage], names: Sequence[str], history: ImageHistory, popularity: ImagePopularity | None,
) -> list[int]:
    """Backends where the request would process nothing it could avoid: each holds (this gateway
    sent it there) every image of the request that was seen before and is not replicated. Never-seen
    images cost the same anywhere; replicated ones are copied once per backend whatever happens."""
    free = set(range(len(names)))
    for image in images:
        if not history.knows(image.key) or (popularity is not None and popularity.is_replicated(image.key)):
            continue
        free &= {names.index(h) for h in history.holders(image.key) if h in names}
        if not free:
            break
    return sorted(free)


def unheld_weight(images: Sequence[RoutedImage], names: Sequence[str], backend: int, history: ImageHistory) -> float:
    """Weight of the request's seen images that ``backend`` would process again: neither sent
    there (``history``) nor homed there (another gateway may have sent them home). Never-seen
    images cost the same anywhere and do not count."""
    homes = image_homes(images, names)
    return sum(image.weight for image, home in zip(images, homes, strict=True)
               if history.knows(image.key) and home != backend and not history.holds(image.key, names[backend]))
