"""Backend choice: session affinity (rendezvous hash) else least-outstanding (power of two
choices), with active health probes and passive ejection."""

from mmgate.routing.health import BackendHealth, HealthStatus
from mmgate.routing.router import Router

__all__ = ["BackendHealth", "HealthStatus", "Router"]
