"""The routing sync between the gateways of one fleet: signed messages over Redis pub/sub."""

from mmgate.routing.sync.channel import RoutingSync, sync_client
from mmgate.routing.sync.peers import Routed
from mmgate.routing.sync.seal import sync_message
from mmgate.routing.sync.secret import SECRET_FLAG, read_sync_secret
from mmgate.routing.sync.senders import PeerBudget

__all__ = ["SECRET_FLAG", "PeerBudget", "Routed", "RoutingSync", "read_sync_secret", "sync_client", "sync_message"]
