"""The health state machine: consecutive-failure ejection, time-gated re-admission."""

from __future__ import annotations

from typing import Any

import pytest

from mmgate.config import GatewaySettings
from mmgate.fleet.health import BackendHealth

SHIPPED = GatewaySettings()


def make(**values: Any) -> BackendHealth:
    """A backend's health as the router builds it: the shipped settings, ``values`` changed."""
    settings = SHIPPED.model_copy(update=values)
    return BackendHealth(eject_after_failures=settings.eject_after_failures, readmit_after_s=settings.readmit_after_s)


def test_starts_healthy() -> None:
    health = make()
    assert health.is_healthy and health.ejected_at is None


def test_one_failure_ejects_as_shipped() -> None:
    health = make()
    assert health.record_failure(10.0) is True
    assert not health.is_healthy
    assert health.ejected_at == 10.0
    assert health.record_failure(11.0) is False  # already out: not ejected twice
    assert health.ejected_at == 10.0


def test_needs_n_consecutive_failures_and_success_resets() -> None:
    health = make(eject_after_failures=3)
    assert not health.record_failure(0.0)
    assert not health.record_failure(0.0)
    assert not health.record_success(0.0)
    assert health.consecutive_failures == 0
    assert not health.record_failure(1.0)
    assert not health.record_failure(1.0)
    assert health.is_healthy
    assert health.record_failure(1.0)
    assert not health.is_healthy


def test_readmitted_only_after_the_minimum_time_out() -> None:
    health = make(readmit_after_s=5.0)
    health.record_failure(100.0)
    assert health.record_success(104.9) is False  # too soon: an in-flight reply, or a flap
    assert not health.is_healthy
    assert health.record_success(105.0) is True
    assert health.is_healthy and health.ejected_at is None
    assert health.record_success(106.0) is False  # already in: nothing to re-admit


def test_zero_time_out_readmits_on_the_first_success() -> None:
    health = make(readmit_after_s=0.0)
    health.record_failure(1.0)
    assert health.record_success(1.0)


def test_ejected_again_after_readmission() -> None:
    health = make(readmit_after_s=1.0)
    health.record_failure(0.0)
    health.record_success(2.0)
    assert health.record_failure(3.0)
    assert health.ejected_at == 3.0


@pytest.mark.parametrize("kwargs", [{"eject_after_failures": 0}, {"readmit_after_s": -1.0}])
def test_bad_settings_are_refused_by_the_settings(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        GatewaySettings(**kwargs)  # type: ignore[arg-type]
