"""Backend choice by a routing profile of named parts (``scheduling``) over one record of what each
backend holds (``holdings``), the fleet's membership and health (``fleet``) and the routing sync
between gateways (``sync``). docs/ROUTING.md has the routing in one page."""

from mmgate.routing.holdings import BackendHoldings, processed_bytes, session_token
from mmgate.routing.router import Router, build_router
from mmgate.routing.scheduling import RoutingPolicy
from mmgate.routing.sync import PeerBudget, Routed, RoutingSync, sync_message
from mmgate.routing.weights import RoutedImage, image_weight

__all__ = [
    "BackendHoldings", "PeerBudget", "Routed", "RoutedImage", "Router", "RoutingPolicy", "RoutingSync",
    "build_router", "image_weight", "processed_bytes", "session_token", "sync_message",
]
