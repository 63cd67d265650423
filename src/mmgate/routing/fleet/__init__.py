"""The fleet: which backends there are, their health and the retired ones still draining."""

from mmgate.routing.fleet.health import BackendHealth, probe
from mmgate.routing.fleet.retire import Retirements

__all__ = ["BackendHealth", "Retirements", "probe"]
