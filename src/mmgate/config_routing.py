"""The routing settings (``--routing*``): a part of ``mmgate.config.GatewaySettings``, kept in a
module of its own so that each stays small. ``mmgate.routing.policy`` explains each mode and
parameter; ``mmgate.routing.sync`` the sync between gateways."""

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
    """How a backend is chosen (``mmgate.routing.policy`` explains each mode and parameter)."""

    model_config = ConfigDict(title="routing")

    mode: Literal["round-robin", "session", "lru-history", "image-affinity"] = setting(
        "image-affinity", flag="--routing",
        help="backend choice: session (the session's rendezvous home, else the less loaded of two), "
        "image-affinity (shared images at their rendezvous homes, a session's own images at the "
        "session's home, bounded loads), lru-history (llm-d-like recent-image history + load), round-robin")
    load_factor: float = setting(
        1.3, flag="--routing-load-factor", ge=1.0, le=100.0,
        help="image-affinity: no backend above this x the mean in-flight requests (bounded loads)")
    load_rounding: Literal["down", "random"] = setting(
        "down", flag="--routing-load-rounding",
        help="image-affinity: the load cap (factor x mean in flight) rounded down (max/mean within the "
        "factor at every moment) or at random, up with the probability of its fraction (within it on "
        "average; fewer spills at small in-flight counts)")
    session_weight: float = setting(
        1.0, flag="--routing-session-weight", ge=0.0, le=100.0,
        help="image-affinity: a session's own images (not seen with another session) count this share "
        "of their weight at the session's home")
    held_weight: float = setting(
        1.2, flag="--routing-held-weight", ge=0.0, le=4.0,
        help="image-affinity: a backend this gateway recently sent an image counts this share of its "
        "weight, so spills go where the image already is (0: homes only; above 1: a holder beats the home)")
    hold_overflow: int = setting(
        0, flag="--routing-hold-overflow", ge=0, le=16,
        help="image-affinity: requests over the load cap a backend may take for a request that would "
        "process images again where it spills (0: the cap is strict)")
    history_keys: int = setting(100_000, flag="--routing-history-keys", ge=1,
                                help="images the routing history and popularity counts remember (bounded LRU)")
    replicate_share: float = setting(
        0.25, flag="--routing-replicate-share", ge=0.0, le=1.0,
        help="image-affinity: an image shown in at least this share of recent requests counts as held "
        "everywhere and stops pulling requests to its home, until its share falls below half of this (0: off)")
    held_balance: bool = setting(
        True, flag="--no-routing-held-balance",
        help="image-affinity: do not send a request that several backends hold all the images of to the "
        "least loaded of them (its preferred one only, under the cap)")
    popularity_half_life: float = setting(
        1000.0, flag="--routing-popularity-half-life", gt=0.0, le=1e9,
        help="image-affinity: requests (seen by this gateway) after which an image's popularity count halves")
    load_poll_interval_s: float = setting(
        0.2, flag="--routing-load-poll-interval", ge=0.0, le=10.0,
        help="seconds between polls of each vllm backend's running + waiting requests (/metrics), "
        "so the load every gateway puts on it weighs in the balance; 0: this gateway's own in-flight "
        "requests only")
    load_poll_timeout_s: float = setting(
        0.25, flag="--routing-load-poll-timeout", gt=0.0, le=10.0,
        help="seconds one load poll may take; a backend that does not answer counts this gateway's "
        "own in-flight requests until it does")

    sync: bool = setting(
        False, flag="--routing-sync",
        help="share this gateway's routing — the images it sent where, its in-flight requests per "
        "backend — with the other gateways in front of the same backends, over the pub/sub of the "
        "--redis-url (or --routing-sync-url), off the request path")
    sync_url: str | None = setting(
        None, flag="--routing-sync-url",
        help="Redis (redis://, rediss://, unix://) for the routing sync, when not the --redis-url; "
        "setting it turns the sync on")
    sync_channel: str = setting(
        "mmgate:routing", flag="--routing-sync-channel", min_length=1, max_length=200,
        help="pub/sub channel of the routing sync: the same on every gateway of one fleet")
    sync_interval_s: float = setting(
        0.01, flag="--routing-sync-interval", ge=0.001, le=1.0,
        help="least seconds between this gateway's routing-sync messages (a change goes out at once; "
        "changes within this time go together in the next message)")
    sync_max_age_s: float = setting(
        1.0, flag="--routing-sync-max-age", gt=0.0, le=60.0,
        help="seconds after which another gateway's last in-flight counts no longer count (it stopped "
        "or the sync is down: each gateway falls back to its own counts and the load poll)")

    @field_validator("sync_url")
    @classmethod
    def _check_sync_url(cls, value: str | None) -> str | None:
        return check_redis_url(value)

    @field_validator("load_poll_interval_s")
    @classmethod
    def _check_poll_interval(cls, value: float) -> float:
        if 0 < value < 0.02:
            raise ValueError("must be 0 (off) or at least 0.02 seconds (each poll reads every backend's /metrics)")
        return value
