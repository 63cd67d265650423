"""What the other gateways of a fleet say about their routing: the wire format. Pure.

A gateway sees only the requests it routes. With G gateways in front of the same backends each
one's record of what each backend holds has a G-th of where images went, so the same images are
processed again on backends the others already sent them to. ``mmgate.routing.sync`` carries,
off the request path, what each gateway's backends answered (as Dynamo's router replicas share
their state): a message body is ``{"v": 3, "s": [...]}``, ``s`` the requests answered since the
sender's last message: backend, the session's 64-bit token
(``mmgate.fleet.holdings.session_token``, never the session id; -1 for none) and the image keys
(tenant-scoped uuids or content hashes: what the record holds anyway). The receiver records each
in its own record of what each backend holds, as if it had routed it.

This is the body of a signed message (``mmgate.routing.sync.seal`` has the envelope: its sender,
number and signature, checked before the body is read). A body is still checked field by field:
``decode`` refuses it whole (``InvalidSync``) unless every field has its type and bound; the
router drops the backends it does not know, so nothing in a message can grow a structure past its bound.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

VERSION = 3  # 2 also carried each sender's in-flight requests per backend
MAX_BODY_BYTES = 256 * 1024
MAX_EVENTS = 256  # routed requests per message; the rest go in the next one
MAX_KEYS = 64  # image keys per routed request (a request with more sends its first 64)
# Image keys per message: what bounds the work one message costs a receiver (each key is recorded);
# at one message per 10 ms still ~100k keys a second.
MAX_MESSAGE_KEYS = 1024
MAX_KEY_CHARS = 512
_TOKEN_RANGE = (-1, 2**64 - 1)


class InvalidSync(ValueError):
    """A sync message that is not one: refused whole."""


@dataclass(frozen=True, slots=True)
class Routed:
    """One request another gateway routed: where, for which session token, with which images."""

    backend: str
    token: int
    keys: tuple[str, ...]


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


def encode(batch: Sequence[Routed]) -> bytes:
    """One message's body: ``batch`` as ``take`` cut it (each request's first ``MAX_KEYS`` keys)."""
    return orjson.dumps({"v": VERSION, "s": [[r.backend, r.token, list(r.keys[:MAX_KEYS])] for r in batch]})


def decode(data: bytes | memoryview) -> list[Routed]:
    """The answered requests in a message's body (``mmgate.routing.sync.seal.unseal`` bounds its
    size); ``InvalidSync`` unless every field has its type and bound."""
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError as exc:  # deep nesting and bad UTF-8 too
        raise InvalidSync(f"not JSON: {exc}") from None
    if not isinstance(body, dict) or body.get("v") != VERSION:
        raise InvalidSync(f"not a version-{VERSION} sync message")
    routed = body.get("s")
    if not isinstance(routed, list) or len(routed) > MAX_EVENTS:
        raise InvalidSync(f"'s' must be a list of at most {MAX_EVENTS} routed requests")
    events: list[Routed] = []
    keys = 0
    for i, event in enumerate(routed):
        if not (isinstance(event, list) and len(event) == 3 and isinstance(event[0], str)
                and _is_int(event[1]) and _TOKEN_RANGE[0] <= event[1] <= _TOKEN_RANGE[1]
                and isinstance(event[2], list) and len(event[2]) <= MAX_KEYS
                and all(isinstance(k, str) and 0 < len(k) <= MAX_KEY_CHARS for k in event[2])):
            raise InvalidSync(f"'s[{i}]' must be [backend, session token, [image keys]] within bounds")
        keys += len(event[2])
        if keys > MAX_MESSAGE_KEYS:
            raise InvalidSync(f"'s' must hold at most {MAX_MESSAGE_KEYS} image keys in all")
        events.append(Routed(event[0], event[1], tuple(event[2])))
    return events


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
