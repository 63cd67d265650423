"""The pickers, each registered as its module is imported."""

from mmgate.routing.scheduling.pickers.highest_score import HighestScore
from mmgate.routing.scheduling.pickers.round_robin import RoundRobin

__all__ = ["HighestScore", "RoundRobin"]
