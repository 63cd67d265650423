"""The scorers, each registered as its module is imported."""

from mmgate.routing.scheduling.scorers import image_held, image_home, load, session_home

__all__ = ["image_held", "image_home", "load", "session_home"]
