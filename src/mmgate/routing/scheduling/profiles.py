"""The profiles ``--routing`` names (``RoutingSettings.mode``), each its parts by name."""

from __future__ import annotations

from mmgate.routing.scheduling import filters, pickers, scorers
from mmgate.routing.scheduling.registry import PROFILES, Profile, register

__all__ = ["filters", "pickers", "scorers"]  # imported for their registrations

register(PROFILES, "image-affinity", Profile(
    ("model", "health", "capacity"), ("session-home", "image-home", "image-held"), "highest-score"))
register(PROFILES, "session", Profile(("model", "health"), (), "highest-score"))
register(PROFILES, "round-robin", Profile(("model", "health"), (), "round-robin"))
