"""The choice of a backend for one request: filters, scorers and a picker, registered by name and
combined in the profiles ``--routing`` names (``registry``, ``profiles``)."""

from mmgate.routing.scheduling.policy import RoutingPolicy
from mmgate.routing.scheduling.registry import (
    FILTERS,
    PICKERS,
    PROFILES,
    SCORERS,
    Filter,
    FleetView,
    Picker,
    Profile,
    Scorer,
    register,
)
from mmgate.routing.scheduling.request import REASONS, Decision, Request

__all__ = [
    "FILTERS", "PICKERS", "PROFILES", "REASONS", "SCORERS", "Decision", "Filter", "FleetView", "Picker",
    "Profile", "Request", "RoutingPolicy", "Scorer", "register",
]
