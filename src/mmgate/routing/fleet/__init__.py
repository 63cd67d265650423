"""The fleet: the backends routed to as it changes (``membership``), their health (``health``) and
the retired ones still draining (``retire``)."""

from mmgate.routing.fleet.membership import Fleet

__all__ = ["Fleet"]
