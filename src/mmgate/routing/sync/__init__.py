"""The routing sync between the gateways of one fleet: signed messages over Redis pub/sub."""

from mmgate.routing.sync.admission import MIN_SECRET_CHARS, PeerBudget, sync_message
from mmgate.routing.sync.channel import RoutingSync, sync_client
from mmgate.routing.sync.peers import Routed

__all__ = ["MIN_SECRET_CHARS", "PeerBudget", "Routed", "RoutingSync", "sync_client", "sync_message"]
