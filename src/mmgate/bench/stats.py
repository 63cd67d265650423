"""Distribution statistics of the benchmark (pure logic).

Percentiles use numpy's default linear interpolation, as AIPerf does, so the two tools report the
same p50/p90/p99 for the same samples.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

STAT_NAMES: tuple[str, ...] = ("avg", "min", "max", "p50", "p90", "p99", "std", "count")


@dataclass(frozen=True, slots=True)
class Distribution:
    """Summary of a sample: average, extremes, percentiles, standard deviation and size."""

    avg: float
    min: float
    max: float
    p50: float
    p90: float
    p99: float
    std: float
    count: int

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    def scaled(self, factor: float) -> Distribution:
        """The same distribution in another unit (ns → ms: ``factor=1e-6``)."""
        return Distribution(
            self.avg * factor, self.min * factor, self.max * factor, self.p50 * factor,
            self.p90 * factor, self.p99 * factor, self.std * factor, self.count,
        )


def distribution(values: Iterable[float] | np.ndarray) -> Distribution | None:
    """Summary of ``values`` ignoring NaNs; None when there is no value."""
    if isinstance(values, np.ndarray | Sequence | memoryview) or hasattr(values, "buffer_info"):
        arr = np.asarray(values, dtype=np.float64)
    else:
        arr = np.fromiter(values, dtype=np.float64)
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        return None
    p50, p90, p99 = np.percentile(arr, [50.0, 90.0, 99.0])
    return Distribution(
        avg=float(arr.mean()), min=float(arr.min()), max=float(arr.max()), p50=float(p50),
        p90=float(p90), p99=float(p99), std=float(arr.std()), count=int(arr.size),
    )


def rate(count: float, duration_s: float) -> float:
    """``count / duration_s``, 0 for an empty window."""
    return count / duration_s if duration_s > 0 else 0.0


def inter_token_latency_ns(latency_ns: float, ttft_ns: float, output_tokens: int) -> float:
    """AIPerf's ITL: ``(request_latency - ttft) / (output_sequence_length - 1)``; NaN below 2 tokens."""
    if output_tokens < 2 or ttft_ns < 0 or latency_ns < ttft_ns:
        return float("nan")
    return (latency_ns - ttft_ns) / (output_tokens - 1)
