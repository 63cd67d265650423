"""The routing settings (``--routing*``): a part of ``mmgate.config.GatewaySettings``, kept in a
module of its own so that each stays small. The only defaults of the routing: the router and its
policy take every value from here. ``mmgate.routing.scheduling`` explains each profile and its
parts, ``mmgate.routing.sync`` the sync between gateways;
docs/ROUTING.md the routing in one page."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import ConfigDict, field_validator

from mmgate._settings import Frozen, setting

__all__ = ["RoutingSettings", "check_redis_url"]


def check_redis_url(value: str | None) -> str | None:
    """A Redis URL (redis://, rediss://, unix://) or None for unset/empty; never echoes the URL
    in the error (it may carry a password)."""
    if value is None or value == "":
        return None
    scheme = urlsplit(value).scheme
    if scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"scheme must be redis://, rediss:// or unix://, got {scheme or 'none'}://")
    return value


class RoutingSettings(Frozen):
    """How a backend is chosen (``mmgate.routing.scheduling`` explains each profile and parameter)."""

    model_config = ConfigDict(title="routing")

    mode: Literal["round-robin", "session", "image-affinity", "lru-history"] = setting(
        "image-affinity", flag="--routing",
        help="backend choice: image-affinity (images where they are held, else at their rendezvous homes, "
        "a session's own images at the session's home, bounded loads), session (the session's "
        "rendezvous home, else the less loaded of two), round-robin, lru-history (llm-d's baseline: "
        "the share of the image weight each backend holds, plus a load score)")
    load_factor: float = setting(
        1.3, flag="--routing-load-factor", ge=1.0, le=100.0,
        help="image-affinity: no backend above this x the mean in-flight requests (bounded loads)")

    sync: bool = setting(
        False, flag="--routing-sync",
        help="share which backend answered which images with the other gateways in front of the same "
        "backends, over the pub/sub of the --redis-url (or --routing-sync-url), off the request path")
    sync_url: str | None = setting(
        None, flag="--routing-sync-url",
        help="Redis (redis://, rediss://, unix://) for the routing sync, when not the --redis-url; "
        "setting it turns the sync on")
    sync_secret_file: str | None = setting(
        None, flag="--routing-sync-secret-file",
        help="file holding the routing sync's shared secret (at least 32 characters, the same on every "
        "gateway of the fleet): messages are signed with it and unsigned ones dropped; required with the sync")
    sync_channel: str = setting(
        "mmgate:routing", flag="--routing-sync-channel", advanced=True, min_length=1, max_length=200,
        help="pub/sub channel of the routing sync: the same on every gateway of one fleet")

    @field_validator("sync_url")
    @classmethod
    def _check_sync_url(cls, value: str | None) -> str | None:
        return check_redis_url(value)
