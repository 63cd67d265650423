"""A routing-sync message's envelope: signed with the fleet's secret, numbered by its sender. Pure.

Anything that can publish on the channel could otherwise cost every gateway the full decode and
apply of the largest message (``mmgate.routing.sync.peers``) as often as it likes. So a message is

    HMAC-SHA256(secret, rest) (32 bytes) | rest = sender id (16 ASCII hex) | number (8 bytes) | body

**signed** with the fleet's shared secret (``--routing-sync-secret-file``): one without the right
signature is dropped (``forged``) after a hash of at most ``MAX_MESSAGE_BYTES``, before anything is
parsed. Its number and its sender's budget are checked next (``mmgate.routing.sync.senders``).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from mmgate.routing.sync.peers import MAX_BODY_BYTES, Routed, encode

MAC_BYTES = 32
SENDER_CHARS = 16
HEADER_BYTES = MAC_BYTES + SENDER_CHARS + 8
MAX_MESSAGE_BYTES = HEADER_BYTES + MAX_BODY_BYTES
MIN_SECRET_CHARS = 32


class Refused(ValueError):
    """A message dropped before its body is read; ``outcome`` is its metric label."""

    def __init__(self, outcome: str, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome


def seal(secret: bytes, sender: str, number: int, body: bytes) -> bytes:
    """``body`` signed for the channel, from ``sender`` (16 hex characters), its ``number``-th message."""
    if len(sender) != SENDER_CHARS or not sender.isascii():
        raise ValueError(f"a sender id is {SENDER_CHARS} ASCII characters")
    rest = sender.encode() + number.to_bytes(8, "big") + body
    return hmac.digest(secret, rest, hashlib.sha256) + rest


def sync_message(secret: bytes, sender: str, number: int, routed: Sequence[Routed]) -> bytes:
    """A whole signed message, as a gateway publishes it (``mmgate.routing.sync.peers.encode``, sealed)."""
    return seal(secret, sender, number, encode(routed))


def unseal(secret: bytes, data: bytes) -> tuple[str, int, memoryview]:
    """The sender, number and body of a message signed with ``secret``; ``Refused`` otherwise."""
    if not HEADER_BYTES <= len(data) <= MAX_MESSAGE_BYTES:
        raise Refused("invalid", f"message of {len(data)} bytes (a signed one is {HEADER_BYTES}-{MAX_MESSAGE_BYTES})")
    view = memoryview(data)
    if not hmac.compare_digest(view[:MAC_BYTES], hmac.digest(secret, view[MAC_BYTES:], hashlib.sha256)):
        raise Refused("forged", "bad signature")
    sender = bytes(view[MAC_BYTES:MAC_BYTES + SENDER_CHARS]).decode("ascii", "replace")
    number = int.from_bytes(view[MAC_BYTES + SENDER_CHARS:HEADER_BYTES], "big")
    return sender, number, view[HEADER_BYTES:]
