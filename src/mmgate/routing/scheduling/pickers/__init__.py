"""The pickers, each registered as its module is imported."""

from mmgate.routing.scheduling.pickers.highest_score import highest_score
from mmgate.routing.scheduling.pickers.round_robin import round_robin

__all__ = ["highest_score", "round_robin"]
