"""Prometheus metrics of the media loader. Labels are bounded: never a URL, key or session."""

from __future__ import annotations

from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge

Outcome = Literal["local_hit", "shared_hit", "inflight_join", "origin", "error"]
OUTCOMES: tuple[Outcome, ...] = ("local_hit", "shared_hit", "inflight_join", "origin", "error")
AbandonReason = Literal["cancelled", "time_limit", "cpu_budget", "died"]
ABANDON_REASONS: tuple[AbandonReason, ...] = ("cancelled", "time_limit", "cpu_budget", "died")


class MediaMetrics:
    """The loader's metrics, registered on ``registry`` (one set per registry).

    ``origin`` counts images loaded from their source: fetched over http(s), read from a file,
    or decoded from a ``data:`` URL. ``mmgate_origin_bytes_total`` counts bytes received from
    http(s) origins and files only.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.image_loads = Counter(
            "mmgate_image_loads",
            "Image loads by where the image came from (or error)",
            ["outcome"],
            registry=registry,
        )
        # Each outcome's child, bound once (exported as zeros from the start): a load counts
        # without ``labels()``'s lookup, several times a turn.
        self._loads = {outcome: self.image_loads.labels(outcome=outcome) for outcome in OUTCOMES}
        self.origin_bytes = Counter(
            "mmgate_origin_bytes", "Bytes received from image origins", registry=registry
        )
        self.local_cache_bytes = Gauge(
            "mmgate_local_cache_bytes", "Bytes held by the local image cache", registry=registry
        )
        self.local_cache_entries = Gauge(
            "mmgate_local_cache_entries", "Entries in the local image cache", registry=registry
        )
        self.decode_queue_pixels = Gauge(
            "mmgate_decode_queue_pixels",
            "Pixels of large images (over --large-image-pixels) in the large decode lane, queued and "
            "decoding; a request whose large images do not fit under --max-decode-queue-pixels gets 429",
            registry=registry,
        )

        self.decodes_abandoned = Counter(
            "mmgate_image_decodes_abandoned",
            "Image decodes stopped before their end (the decode process killed), by reason: cancelled "
            "(no request waits for it any more), time_limit and cpu_budget (refused: too costly), died (the process failed)",
            ["reason"],
            registry=registry,
        )
        for reason in ABANDON_REASONS:
            self.decodes_abandoned.labels(reason=reason)

    def load(self, outcome: Outcome) -> None:
        self._loads[outcome].inc()
