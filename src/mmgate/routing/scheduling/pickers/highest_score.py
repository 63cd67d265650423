"""Picker ``highest-score``: the candidates by the sum of the scorers' pulls, best first, ties by
the rendezvous order of the first key a scorer offers, else the session's, else the first image's
(the same from every gateway). When a scorer that stays decides, the request stays at the choice;
otherwise the profile's bounding filters apply (``capacity``: the bounded-load spill). The reason
is the first scorer's that pulls the choice. A request nothing pulls (no images, or a profile
without scorers) goes to the session's home, else to the less loaded of two random candidates."""

from __future__ import annotations

from collections.abc import Sequence

from mmgate.routing.scheduling.balance import p2c_rank
from mmgate.routing.scheduling.parts import PICKERS, Bound, Decision, Request, Scores, register
from mmgate.routing.scheduling.rendezvous import rendezvous_rank


def by_score(scores: Sequence[float], names: Sequence[str], tie_key: str) -> list[int]:
    """Indexes of ``names``, highest score first; ties by ``tie_key``'s rendezvous order."""
    tie = {index: position for position, index in enumerate(rendezvous_rank(tie_key, names))}
    return sorted(range(len(names)), key=lambda i: (-scores[i], tie[i]))


def pulls(scores: Scores, stays: bool, count: int) -> list[float]:
    """Per candidate, the pull of the scorers that stay (or of the others), summed in profile order."""
    columns = [pull for scorer, pull in scores if scorer.stays == stays]
    return [sum(c) for c in zip(*columns, strict=True)] if columns else [0.0] * count


def highest_score(request: Request, scores: Scores, bounds: list[Bound]) -> Decision:
    if not scores:
        if request.session_id is not None:
            return Decision(rendezvous_rank(request.session_id, request.names), "session")
        return Decision(p2c_rank(request.loads, request.rng), "least_loaded")
    staying, others = pulls(scores, True, len(request.names)), pulls(scores, False, len(request.names))
    tie = next((key for s, _ in scores if s.tie_key is not None and (key := s.tie_key(request))), None)
    order = by_score([a + b for a, b in zip(staying, others, strict=True)], request.names,
                     tie or request.session_id or request.images[0].key)
    first = order[0]
    stays = next((s.reason for s, _ in scores if s.stays), None)
    if stays is not None and request.session_id is not None and staying[first] >= others[first]:
        return Decision(order, stays)
    reason = next((s.reason for s, pull in scores if not s.stays and pull[first] > 0), "least_loaded")
    for bound in bounds:
        order, moved = bound(request, order)
        reason = "load_spill" if moved else reason
    return Decision(order, reason)


register(PICKERS, "highest-score", lambda: highest_score)  # stateless: one for every policy
