"""The fleet: the backends routed to as it changes, their models, health and load, and the
retired ones still draining."""

from mmgate.routing.fleet.health import BackendHealth, probe
from mmgate.routing.fleet.membership import Fleet
from mmgate.routing.fleet.retire import Retirements

__all__ = ["BackendHealth", "Fleet", "Retirements", "probe"]
