"""The shared tier's node breakers and warning limiter (pure)."""

from __future__ import annotations

from mmgate.store.redis.breakers import NodeBreakers, WarningLimiter


def test_warning_limiter_lets_one_through_per_interval() -> None:
    limiter = WarningLimiter(interval_s=60)
    assert limiter.allow(100.0) == 0
    assert limiter.allow(100.5) is None
    assert limiter.allow(159.9) is None
    assert limiter.allow(160.0) == 2
    assert limiter.allow(161.0) is None
    assert limiter.allow(500.0) == 1


def test_node_breakers_open_per_node_and_wait_for_a_probe() -> None:
    breakers = NodeBreakers(cooldown_s=0.5)
    assert breakers.record_failure("a:1", 10.0) is True
    assert breakers.record_failure("a:1", 10.1) is False  # already open
    assert breakers.is_open("a:1") and not breakers.is_open("b:2")  # the other node is untouched
    assert breakers.due_for_probe(10.4) == []
    assert breakers.due_for_probe(10.5) == ["a:1"]
    assert breakers.is_open("a:1")  # open until a probe (or an operation) succeeds, not by time
    breakers.record_success("a:1")
    assert not breakers.is_open("a:1") and breakers.open_nodes == []
    disabled = NodeBreakers(cooldown_s=0.0)
    assert disabled.record_failure("a:1", 5.0) is False
    assert not disabled.is_open("a:1")
