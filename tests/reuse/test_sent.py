"""What the gateway believes each backend holds: bounded per backend by its cache budget."""

from __future__ import annotations

from mmgate.reuse import SentTracker
from mmgate.reuse.sent import PROCESSED_BYTES_PER_PIXEL, estimated_processed_bytes


def test_sent_tracker_is_bounded_by_the_backend_budget() -> None:
    per_image = estimated_processed_bytes(100, 100, 10**9)
    tracker = SentTracker(budget_bytes=3 * per_image)
    for i in range(5):
        tracker.mark_sent("b0", f"k{i}", 100, 100)
    assert tracker.num_tracked("b0") == 3
    assert not tracker.was_sent("b0", "k0") and tracker.was_sent("b0", "k4")
    assert not tracker.was_sent("b1", "k4")  # per backend
    tracker.forget("b0", "k4")
    assert not tracker.was_sent("b0", "k4") and tracker.was_sent("b0", "k3")
    assert tracker.num_tracked("b0") == 2


def test_estimate_is_capped_by_the_resize_limit() -> None:
    assert estimated_processed_bytes(10, 10, 10**9) == PROCESSED_BYTES_PER_PIXEL * 100 + 1024
    assert estimated_processed_bytes(10_000, 10_000, 1000) == PROCESSED_BYTES_PER_PIXEL * 1000 + 1024


def test_recency_decides_what_is_forgotten() -> None:
    per_image = estimated_processed_bytes(10, 10, 10**9)
    tracker = SentTracker(budget_bytes=2 * per_image)
    tracker.mark_sent("b", "old", 10, 10)
    tracker.mark_sent("b", "new", 10, 10)
    assert tracker.was_sent("b", "old")  # touched: now the most recent
    tracker.mark_sent("b", "third", 10, 10)
    assert tracker.was_sent("b", "old") and not tracker.was_sent("b", "new")
