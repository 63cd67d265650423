"""What the other gateways of a fleet say about their routing: the wire format and their loads. Pure.

A gateway sees only the requests it routes. With G gateways in front of the same backends each
one's record of what each backend holds has a G-th of where images went, and its in-flight
counts a G-th of the load, so the same images are processed again on
backends the others already sent them to and the bounded-load cap works on a third of the truth.
``mmgate.routing.sync`` carries, off the request path, what each gateway did to the others (as
Dynamo's router replicas share their active-sequence state): one message every sync interval with

* ``l``: the sender's requests in flight per backend, now (a snapshot: a lost message costs
  nothing once the next one arrives);
* ``s``: the requests it routed since its last message: backend, the session's 64-bit token
  (``mmgate.routing.holdings.session_token``, never the session id; -1 for none) and the image keys
  (tenant-scoped uuids or content hashes: what the record holds anyway).

The receiver records each routed request in its own record of what each backend holds, as if it had routed
it, and counts the sender's in-flight requests until ``max_age_s`` after its last message.

This is the body of a signed message (``mmgate.routing.admission`` has the envelope: its sender,
number and signature, checked before the body is read). A body is still checked field by field:
``decode`` refuses it whole (``InvalidSync``) unless every field has its type and bound, and drops
the backends this gateway does not know; nothing in a message can grow a structure past its bound.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import orjson

VERSION = 2
MAX_MESSAGE_BYTES = 256 * 1024
MAX_EVENTS = 256  # routed requests per message; the rest go in the next one
MAX_KEYS = 64  # image keys per routed request (a request with more sends its first 64)
# Image keys per message: what bounds the work one message costs a receiver (each key is recorded);
# at one message per 10 ms still ~100k keys a second.
MAX_MESSAGE_KEYS = 1024
MAX_KEY_CHARS = 512
MAX_BACKENDS = 256
MAX_INFLIGHT = 1_000_000
MAX_PEERS = 64
_TOKEN_RANGE = (-1, 2**64 - 1)


class InvalidSync(ValueError):
    """A sync message that is not one: refused whole."""


@dataclass(frozen=True, slots=True)
class Routed:
    """One request another gateway routed: where, for which session token, with which images."""

    backend: str
    token: int
    keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SyncMessage:
    loads: dict[str, int]
    routed: list[Routed]


def take(pending: deque[Routed]) -> list[Routed]:
    """The routed requests of the next message, off the front of ``pending``: at most
    ``MAX_EVENTS``, ``MAX_MESSAGE_KEYS`` keys in all (each request's first ``MAX_KEYS``)."""
    batch: list[Routed] = []
    keys = 0
    while pending and len(batch) < MAX_EVENTS and keys + min(MAX_KEYS, len(pending[0].keys)) <= MAX_MESSAGE_KEYS:
        routed = pending.popleft()
        batch.append(routed)
        keys += min(MAX_KEYS, len(routed.keys))
    return batch


def encode(loads: Mapping[str, int], routed: Sequence[Routed]) -> bytes:
    """One message's body (``routed`` as ``take`` would cut it)."""
    batch = take(deque(routed))
    body = {"v": VERSION, "l": dict(loads), "s": [[r.backend, r.token, list(r.keys[:MAX_KEYS])] for r in batch]}
    return orjson.dumps(body)


def decode(data: bytes | memoryview, names: Collection[str]) -> SyncMessage:
    """The message in ``data``, keeping only backends in ``names``; ``InvalidSync`` otherwise."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise InvalidSync(f"message of {len(data)} bytes (at most {MAX_MESSAGE_BYTES})")
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError as exc:  # deep nesting and bad UTF-8 too
        raise InvalidSync(f"not JSON: {exc}") from None
    if not isinstance(body, dict) or body.get("v") != VERSION:
        raise InvalidSync(f"not a version-{VERSION} sync message")
    loads, routed = body.get("l"), body.get("s")
    if not isinstance(loads, dict) or len(loads) > MAX_BACKENDS:
        raise InvalidSync(f"'l' must be an object of at most {MAX_BACKENDS} backends")
    kept: dict[str, int] = {}
    for name, count in loads.items():
        if not _is_int(count) or not 0 <= count <= MAX_INFLIGHT:
            raise InvalidSync(f"'l.{name[:64]}' must be an integer in 0..{MAX_INFLIGHT}")
        if name in names:
            kept[name] = count
    if not isinstance(routed, list) or len(routed) > MAX_EVENTS:
        raise InvalidSync(f"'s' must be a list of at most {MAX_EVENTS} routed requests")
    if sum(len(event[2]) for event in routed if isinstance(event, list) and len(event) == 3
           and isinstance(event[2], list)) > MAX_MESSAGE_KEYS:
        raise InvalidSync(f"'s' must hold at most {MAX_MESSAGE_KEYS} image keys in all")
    events = []
    for i, event in enumerate(routed):
        if not (isinstance(event, list) and len(event) == 3 and isinstance(event[0], str)
                and _is_int(event[1]) and _TOKEN_RANGE[0] <= event[1] <= _TOKEN_RANGE[1]
                and isinstance(event[2], list) and len(event[2]) <= MAX_KEYS
                and all(isinstance(k, str) and 0 < len(k) <= MAX_KEY_CHARS for k in event[2])):
            raise InvalidSync(f"'s[{i}]' must be [backend, session token, [image keys]] within bounds")
        if event[0] in names:
            events.append(Routed(event[0], event[1], tuple(event[2])))
    return SyncMessage(kept, events)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class PeerLoads:
    """The other gateways' latest in-flight counts per backend, each until ``max_age_s`` after it
    arrived; at most ``max_peers`` gateways (the longest silent one goes first)."""

    def __init__(self, max_age_s: float, *, max_peers: int = MAX_PEERS) -> None:
        if max_age_s <= 0 or max_peers < 1:
            raise ValueError("max_age_s must be positive and max_peers at least 1")
        self.max_age_s = max_age_s
        self.max_peers = max_peers
        self._peers: dict[str, tuple[dict[str, int], float]] = {}

    def update(self, gateway: str, loads: dict[str, int], now: float) -> None:
        self._peers.pop(gateway, None)  # re-inserted last: the dict is ordered by last message
        self._peers[gateway] = (loads, now)
        while len(self._peers) > self.max_peers:
            del self._peers[next(iter(self._peers))]

    def total(self, backend: str, now: float) -> int:
        """Requests in flight to ``backend`` from every other gateway heard from recently."""
        return sum(loads.get(backend, 0) for loads, at in self._peers.values() if now - at <= self.max_age_s)

    def fresh(self, now: float) -> int:
        """Gateways heard from within ``max_age_s``."""
        return sum(1 for _, at in self._peers.values() if now - at <= self.max_age_s)
