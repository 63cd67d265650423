"""The fleet-load estimate (pure) and the reading of vLLM's scheduler gauges."""

from __future__ import annotations

import pytest

from mmgate.routing.load import FleetLoad
from mmgate.vllm_protocol import engine_load

VLLM_PAGE = b"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 3.0
vllm:num_requests_running{engine="1",model_name="qwen"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen"} 2.0
vllm:num_requests_waiting{engine="1",model_name="qwen"} 0.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="qwen",reason="capacity"} 2.0
vllm:num_requests_running_total 50.0
vllm:gpu_cache_usage_perc{engine="0",model_name="qwen"} 0.5
"""


def test_engine_load_sums_running_and_waiting_over_engines_and_nothing_else() -> None:
    assert engine_load(VLLM_PAGE) == 6
    assert engine_load(b"vllm:num_requests_running 0\n") == 0
    assert engine_load(b"vllm:num_requests_waiting{a=\"b\"} 2 1700000000000\n") == 2  # with a timestamp
    assert engine_load(b"# nothing\nmmgate_x 1\n") is None
    assert engine_load(b"vllm:num_requests_running{engine=\"0\"} NaN\n") is None
    assert engine_load(b"") is None


def test_without_a_reading_the_estimate_is_the_own_count() -> None:
    fleet = FleetLoad(max_age_s=1.0)
    assert fleet.estimate("a", 3, now=0.0) == 3


def test_the_engine_reading_moves_with_own_requests_since_and_never_falls_below_own() -> None:
    fleet = FleetLoad(max_age_s=1.0)
    fleet.record("a", engine=7, own_now=2, now=10.0)  # 5 of the 7 are other gateways'
    assert fleet.estimate("a", 2, now=10.1) == 7
    assert fleet.estimate("a", 4, now=10.1) == 9  # two more started since: not in the reading yet
    assert fleet.estimate("a", 0, now=10.1) == 5  # ours ended
    fleet.record("a", engine=1, own_now=3, now=10.2)  # three of ours still in image processing
    assert fleet.estimate("a", 3, now=10.3) == 3
    assert fleet.engine("a", now=10.3) == 1


def test_a_failed_stale_or_silent_poll_falls_back_to_the_own_count() -> None:
    fleet = FleetLoad(max_age_s=0.5)
    fleet.record("a", engine=9, own_now=0, now=0.0)
    assert fleet.estimate("a", 1, now=0.4) == 10
    assert fleet.estimate("a", 1, now=0.6) == 1 and fleet.engine("a", now=0.6) is None  # stale
    fleet.record("a", engine=9, own_now=0, now=1.0)
    fleet.fail("a")
    assert fleet.estimate("a", 1, now=1.1) == 1
    fleet.record("a", engine=9, own_now=0, now=2.0)
    fleet.record("a", engine=None, own_now=0, now=2.1)  # it stopped exporting the gauges
    assert fleet.estimate("a", 1, now=2.2) == 1


def test_max_age_must_be_positive() -> None:
    with pytest.raises(ValueError):
        FleetLoad(max_age_s=0)


def test_with_other_gateways_in_flight_own_changes_count_for_the_fleet() -> None:
    fleet = FleetLoad(max_age_s=1.0)
    for _ in range(30):  # every round: the engines hold 3x what this gateway has in flight
        fleet.record("a", engine=6, own_now=2, now=0.0)
        fleet.record("b", engine=3, own_now=1, now=0.0)
        fleet.end_round(now=0.0)
    assert fleet.share == pytest.approx(3.0, rel=0.01)
    # One more request of ours to a: the others likely sent as many since the poll.
    assert fleet.estimate("a", 3, now=0.1) == 9
    assert fleet.estimate("a", 1, now=0.1) == 3  # one of ours ended: so did theirs
    fleet.record("a", engine=0, own_now=0, now=1.0)
    fleet.record("b", engine=0, own_now=0, now=1.0)
    fleet.end_round(now=1.0)  # nothing of ours in flight: the share stays what it was
    assert fleet.share == pytest.approx(3.0, rel=0.01)


def test_the_share_is_bounded() -> None:
    fleet = FleetLoad(max_age_s=1.0, max_share=4.0)
    for _ in range(50):
        fleet.record("a", engine=100, own_now=1, now=0.0)
        fleet.end_round(now=0.0)
    assert fleet.share == pytest.approx(4.0, rel=0.01)
    with pytest.raises(ValueError):
        FleetLoad(max_age_s=1.0, max_share=0.5)
