"""Percentile statistics, AIPerf's ITL, the client-bottleneck warnings, result comparison (pure)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mmgate.bench.compare import compare_rows, flatten, ratio
from mmgate.bench.overhead import ClientOverhead, client_warnings
from mmgate.bench.stats import distribution, inter_token_latency_ns


def test_distribution_matches_numpy_and_ignores_nan() -> None:
    values = [float(v) for v in range(1, 101)] + [math.nan]
    d = distribution(values)
    assert d is not None
    assert (d.count, d.min, d.max, d.avg) == (100, 1.0, 100.0, 50.5)
    assert d.p50 == pytest.approx(np.percentile(np.arange(1, 101), 50))
    assert d.p90 == pytest.approx(90.1)
    assert d.p99 == pytest.approx(99.01)
    assert distribution([]) is None
    assert distribution([math.nan]) is None
    assert d.scaled(1e-3).max == pytest.approx(0.1)


def test_inter_token_latency_follows_aiperf() -> None:
    assert inter_token_latency_ns(1_000, 100, 10) == pytest.approx(100.0)
    assert math.isnan(inter_token_latency_ns(1_000, 100, 1))
    assert math.isnan(inter_token_latency_ns(1_000, -1, 5))


def _overhead(cpu: float, loop_p99: float, send_p99: float) -> ClientOverhead:
    return ClientOverhead(cpu, cpu / 100 * 10, 10.0, distribution([0.1, loop_p99]),
                          distribution([0.1, send_p99]))


def test_client_warnings() -> None:
    assert client_warnings(_overhead(30, 0.2, 0.2), 100.0, 99.0) == []
    warnings = client_warnings(_overhead(97, 20, 30), 100.0, 50.0)
    assert len(warnings) == 4
    assert "97% of a CPU core" in warnings[0]
    assert "event-loop lag" in warnings[1]
    assert "after they were due" in warnings[2]
    assert "achieved 50.0 requests/s" in warnings[3]


def test_compare_rows_ratio() -> None:
    a = {"metrics": {"ttft_ms": {"avg": 10.0, "p50": 8.0, "count": 3}}, "totals": {"image_bytes_sent": 1000},
         "client": {"cpu_percent": 20.0, "loop_lag_ms": None}}
    b = {"metrics": {"ttft_ms": {"avg": 5.0, "p50": 8.0, "count": 3}}, "totals": {"image_bytes_sent": 250,
                                                                                   "errors": 0}}
    assert flatten(a) == {"ttft_ms.avg": 10.0, "ttft_ms.p50": 8.0, "image_bytes_sent": 1000.0,
                          "client.cpu_percent": 20.0}
    rows = {k: (va, vb, r) for k, va, vb, r in compare_rows(a, b)}
    assert rows["ttft_ms.avg"] == (10.0, 5.0, 0.5)
    assert rows["image_bytes_sent"] == (1000.0, 250.0, 0.25)
    assert rows["client.cpu_percent"] == (20.0, None, None)
    assert rows["errors"] == (None, 0.0, None)
    assert ratio(0, 0) == 1.0 and ratio(0, 1) is None
