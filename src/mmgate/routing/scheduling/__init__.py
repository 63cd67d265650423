"""The choice of a backend for one request."""

from mmgate.routing.scheduling.policy import Decision, RoutingPolicy

__all__ = ["Decision", "RoutingPolicy"]
