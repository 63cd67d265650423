"""The filters, each registered as its module is imported."""

from mmgate.routing.scheduling.filters.capacity import bounded
from mmgate.routing.scheduling.filters.health import healthy
from mmgate.routing.scheduling.filters.model import serving

__all__ = ["bounded", "healthy", "serving"]
