"""What a signed routing-sync message (``mmgate.routing.sync.seal``) must pass next, by its
sender, before a gateway parses it. Pure.

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

from collections import OrderedDict
from dataclasses import dataclass

from mmgate.routing.sync.seal import Refused

# Each sender's share of one gateway's event loop, and the fleet's together (a legitimate sender
# at full pace, 100 messages a second of a few routed requests each, uses well under 1 %).
CPU_PER_S = 0.02
BURST_S = 0.1
TOTAL_CPU_PER_S = 0.1
MAX_SENDERS = 64


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
