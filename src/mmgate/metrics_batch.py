"""Request-path counts as plain numbers, moved into their Prometheus children when the registry is
collected (a scrape): a counter's ``inc()`` takes a lock, a histogram's ``observe()`` two locks and a
walk of its buckets, and every request makes several. The event loop is the only writer, and a
scrape runs in it too, so plain numbers need no lock. ``FlushPending``, registered before the
metrics it serves, moves them in before those are read.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector


class Tally:
    """A counter child's increments as a plain integer (``n``), added to it when the registry is
    collected (``inc()`` takes a lock per call; the event loop is the only writer)."""

    __slots__ = ("child", "n")

    def __init__(self, child: Any) -> None:
        self.child = child
        self.n = 0

    def flush(self) -> None:
        if self.n:
            self.child.inc(self.n)
            self.n = 0


class Spread:
    """A histogram child's observations as plain bucket counts and a sum, added to the child when
    the registry is collected: its ``observe`` takes two locks and walks the buckets. Reads the
    child's bucket bounds and values (prometheus_client's ``_upper_bounds``, ``_buckets``, ``_sum``;
    tests/observe/test_metrics_batched.py holds the exposition equal to plain ``observe`` calls)."""

    __slots__ = ("bounds", "child", "counts", "total")

    def __init__(self, child: Any) -> None:
        self.child = child
        self.bounds: list[float] = list(child._upper_bounds)  # ends with +Inf
        self.counts = [0] * len(self.bounds)
        self.total = 0.0

    def observe(self, amount: float) -> None:
        """The bucket ``Histogram.observe`` would count ``amount`` in: the first bound ≥ it."""
        index = bisect_left(self.bounds, amount)
        if index < len(self.counts):
            self.counts[index] += 1
        self.total += amount

    def flush(self) -> None:
        for index, count in enumerate(self.counts):
            if count:
                self.child._buckets[index].inc(count)
                self.counts[index] = 0
        if self.total:
            self.child._sum.inc(self.total)
            self.total = 0.0


class FlushPending(Collector):
    """Moves the pending request-path counts into their children; yields no metric of its own."""

    def __init__(self, pending: list[Tally | Spread]) -> None:
        self._pending = pending

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        for item in self._pending:
            item.flush()
        return iter(())
