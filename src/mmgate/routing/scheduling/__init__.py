"""The choice of a backend for one request: filters, scorers and a picker, each registered by name
(``parts``), combined in the profiles ``--routing`` names (``profiles``) and run by ``policy``."""

from mmgate.routing.scheduling.policy import RoutingPolicy

__all__ = ["RoutingPolicy"]
