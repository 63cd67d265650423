"""The pickers, each registered as its module is imported."""

from mmgate.routing.scheduling.pickers import highest_score, round_robin

__all__ = ["highest_score", "round_robin"]
