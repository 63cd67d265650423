"""Backend choice among the fleet (``mmgate.fleet``) by a routing profile of named parts
(``scheduling``), weighing each image (``weights``), and the routing sync between gateways
(``sync``). docs/ROUTING.md has the routing in one page."""

from mmgate.routing.router import Router, build_router
from mmgate.routing.scheduling import RoutingPolicy
from mmgate.routing.sync import PeerBudget, Routed, RoutingSync, sync_message
from mmgate.routing.weights import RoutedImage, image_weight

__all__ = [
    "PeerBudget", "Routed", "RoutedImage", "Router", "RoutingPolicy", "RoutingSync", "build_router",
    "image_weight", "sync_message",
]
