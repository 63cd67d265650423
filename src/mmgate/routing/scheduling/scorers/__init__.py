"""The scorers, each registered as its module is imported."""

from mmgate.routing.scheduling.scorers.image_held import held_pull
from mmgate.routing.scheduling.scorers.image_home import home_pull
from mmgate.routing.scheduling.scorers.load import load_scores
from mmgate.routing.scheduling.scorers.lru_history import held_share
from mmgate.routing.scheduling.scorers.session_home import session_pull

__all__ = ["held_pull", "held_share", "home_pull", "load_scores", "session_pull"]
