"""The filters, each registered as its module is imported."""

from mmgate.routing.scheduling.filters import capacity, health, model

__all__ = ["capacity", "health", "model"]
