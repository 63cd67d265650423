"""What a routing-sync message must pass before a gateway spends work on it. Pure.

Anything that can publish on the channel could otherwise cost every gateway the full decode and
apply of the largest message (``mmgate.routing.sync.peers``) as often as it likes. So a message is

    HMAC-SHA256(secret, rest) (32 bytes) | rest = sender id (16 ASCII hex) | number (8 bytes) | body

* **signed** with the fleet's shared secret (``--routing-sync-secret-file``): one without the
  right signature is dropped (``forged``) after a hash of at most ``MAX_MESSAGE_BYTES``, before
  anything is parsed;
* **in order**: each sender numbers its messages; one not above the last number heard from its
  sender is a replay (``replayed``), dropped before it is parsed, so a recorded message sent again
  costs a hash and takes nothing from its sender's budget;
* **within its sender's budget** (``PeerBudget``): each sender may take ``CPU_PER_S`` seconds of
  the event loop's CPU a second (up to ``BURST_S`` at once), and every sender together
  ``TOTAL_CPU_PER_S``; past it its messages are dropped unparsed (``over_budget``) until the
  budget refills. A key holder (a gateway of the fleet, or whoever stole the secret) is held to
  that bound too. The charge is everything an admitted message costs the gateway from its
  signature check on (``time.thread_time``, nanoseconds), small messages as large ones; what is
  left is reading a message off the socket, which every message costs, dropped or not.
"""

from __future__ import annotations

import hashlib
import hmac
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from mmgate.routing.sync.peers import MAX_BODY_BYTES, Routed, encode

MAC_BYTES = 32
SENDER_CHARS = 16
HEADER_BYTES = MAC_BYTES + SENDER_CHARS + 8
MAX_MESSAGE_BYTES = HEADER_BYTES + MAX_BODY_BYTES
MIN_SECRET_CHARS = 32
# Each sender's share of one gateway's event loop, and the fleet's together (a legitimate sender
# at full pace, 100 messages a second of a few routed requests each, uses well under 1 %).
CPU_PER_S = 0.02
BURST_S = 0.1
TOTAL_CPU_PER_S = 0.1
MAX_SENDERS = 64


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


@dataclass(slots=True)
class _Sender:
    last_number: int
    cpu_s: float  # seconds of the event loop it may still take (below zero: in debt)
    at: float


class PeerBudget:
    """Each sender's message order and budget, at most ``max_senders`` (the longest silent goes).
    Only signed messages reach it, so only key holders take a place."""

    def __init__(self, *, cpu_per_s: float = CPU_PER_S, burst_s: float = BURST_S,
                 total_cpu_per_s: float = TOTAL_CPU_PER_S, max_senders: int = MAX_SENDERS) -> None:
        if min(cpu_per_s, burst_s, total_cpu_per_s) <= 0 or max_senders < 1:
            raise ValueError("budgets must be positive and max_senders at least 1")
        self.cpu_per_s, self.burst_s, self.total_cpu_per_s = cpu_per_s, burst_s, total_cpu_per_s
        self.max_senders = max_senders
        self._senders: OrderedDict[str, _Sender] = OrderedDict()
        self._total = _Sender(0, burst_s, float("-inf"))
        self.spent_s = 0.0  # CPU time every admitted message took, in all
        self.largest_s = 0.0  # the most one message took: what a bucket can be overdrawn by

    def admit(self, sender: str, number: int, now: float) -> None:
        """Let one message of ``sender`` in (then ``charge`` what it took), or raise ``Refused``."""
        state = self._senders.get(sender)
        if state is None:
            state = self._senders[sender] = _Sender(-1, self.burst_s, now)
            while len(self._senders) > self.max_senders:
                self._senders.popitem(last=False)
        self._senders.move_to_end(sender)
        if number <= state.last_number:
            raise Refused("replayed", f"message {number} of {sender} after {state.last_number}")
        state.last_number = number
        elapsed = max(0.0, now - state.at)
        state.at = now
        state.cpu_s = min(self.burst_s, state.cpu_s + elapsed * self.cpu_per_s)
        total = self._total
        total.cpu_s = min(self.burst_s, total.cpu_s + max(0.0, now - total.at) * self.total_cpu_per_s)
        total.at = now
        if state.cpu_s <= 0 or total.cpu_s <= 0:
            raise Refused("over_budget", f"{sender} is over its budget")

    def charge(self, sender: str, seconds: float) -> None:
        """``sender``'s admitted message took ``seconds`` of the event loop's CPU."""
        state = self._senders.get(sender)
        if state is not None:
            state.cpu_s -= seconds
        self._total.cpu_s -= seconds
        self.spent_s += seconds
        self.largest_s = max(self.largest_s, seconds)
