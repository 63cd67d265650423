"""The profiles ``--routing`` names (``RoutingSettings.mode``), each its parts by name."""

from __future__ import annotations

# Imported for their registrations: every part each subpackage's __init__ imports.
import mmgate.routing.scheduling.filters
import mmgate.routing.scheduling.pickers
import mmgate.routing.scheduling.scorers  # noqa: F401
from mmgate.routing.scheduling.parts import PROFILES, Profile, register

register(PROFILES, "image-affinity", Profile(
    ("model", "health", "capacity"), ("session-home", "image-home", "image-held"), "highest-score"))
register(PROFILES, "session", Profile(("model", "health"), (), "highest-score"))
register(PROFILES, "round-robin", Profile(("model", "health"), (), "round-robin"))
register(PROFILES, "lru-history", Profile(("model", "health"), ("lru-history", "load"), "highest-score"))
