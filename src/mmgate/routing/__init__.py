"""Backend choice by a routing policy (session affinity, image affinity with bounded loads, an
llm-d-like image history, round robin), with active health probes and passive ejection."""

from mmgate.routing.health import BackendHealth, HealthStatus
from mmgate.routing.history import ImageHistory
from mmgate.routing.policy import ROUTING_MODES, Decision, RoutingPolicy
from mmgate.routing.router import Router
from mmgate.routing.setup import build_router
from mmgate.routing.weights import RoutedImage, image_tokens, image_weight

__all__ = [
    "ROUTING_MODES", "BackendHealth", "Decision", "HealthStatus", "ImageHistory", "RoutedImage", "Router",
    "RoutingPolicy", "build_router", "image_tokens", "image_weight",
]
