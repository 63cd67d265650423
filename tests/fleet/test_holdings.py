"""The one record of what each backend holds: bounded per backend by its modelled cache and in
keys, forgotten on a heal and on a re-admission; who showed each image, bounded too."""

from __future__ import annotations

import pytest

from mmgate.config import GatewaySettings
from mmgate.fleet import BackendHoldings, processed_bytes, session_token


def test_sized_by_the_shipped_settings() -> None:
    settings = GatewaySettings()
    holdings = BackendHoldings.for_settings(settings)
    assert holdings.budget_bytes == int(settings.reuse_backend_cache_gb * 1024**3)
    assert holdings.max_entries == holdings.max_keys == settings.reuse_tracked_uuids


def test_each_backend_is_bounded_by_its_cache_budget_and_recency_decides() -> None:
    size = processed_bytes(256)
    holdings = BackendHoldings(3 * size, max_entries=100, max_keys=100)
    holdings.hold("b0", [(f"k{i}", size) for i in range(5)])
    assert holdings.num_held("b0") == 3
    assert not holdings.holds("b0", "k0") and holdings.holds("b0", "k4")
    assert not holdings.holds("b1", "k4")  # per backend
    holdings.hold("b0", [("k2", size)])  # answered again: now the most recent
    holdings.hold("b0", [("k5", size)])
    assert holdings.holds("b0", "k2") and not holdings.holds("b0", "k3")
    assert holdings.holders("k2") == ["b0"]


def test_bounded_in_entries_not_only_in_modelled_bytes() -> None:
    holdings = BackendHoldings(4 * 1024**3, max_entries=1000, max_keys=10)
    holdings.hold("b0", [(f"k{i}", 64) for i in range(5000)])
    assert holdings.num_held("b0") == 1000
    holdings.show([f"k{i}" for i in range(5000)], 1)
    assert not holdings.knows("k0") and holdings.knows("k4999")


def test_a_heal_forgets_the_request_and_a_readmission_the_backend() -> None:
    holdings = BackendHoldings(1 << 30, max_entries=100, max_keys=100)
    for backend in ("b0", "b1"):
        holdings.hold(backend, [("a", 1), ("b", 1), ("c", 1)])
    holdings.show(["a", "b", "c"], session_token("s"))
    holdings.forget("b0", ["a", "b"])
    assert holdings.holders("a") == ["b1"] and holdings.holders("c") == ["b0", "b1"]
    holdings.forget_backend("b1")
    assert holdings.holders("a") == [] and holdings.holders("c") == ["b0"]
    assert holdings.knows("a") and not holdings.is_shared("a", "s")  # the clients' side is kept


def test_an_image_shown_by_another_session_or_none_is_shared() -> None:
    holdings = BackendHoldings(1 << 30, max_entries=100, max_keys=100)
    assert not holdings.is_shared("x", "s1") and not holdings.knows("x")
    holdings.show(["x"], session_token("s1"))
    assert not holdings.is_shared("x", "s1") and holdings.is_shared("x", "s2") and holdings.is_shared("x", None)
    holdings.show(["x"], session_token("s2"))
    assert holdings.is_shared("x", "s1")
    holdings.show(["y"], session_token(None))
    assert holdings.is_shared("y", "s1")


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        BackendHoldings(-1, max_entries=1, max_keys=1)
    with pytest.raises(ValueError):
        BackendHoldings(1, max_entries=0, max_keys=1)


def test_backends_that_left_the_fleet_are_forgotten_whole() -> None:
    holdings = BackendHoldings(10**9, max_entries=100, max_keys=100)
    for backend in ("b0", "b1", "b2"):
        holdings.hold(backend, [("k", 1024)])
    holdings.show(["k"], session_token("s"))
    holdings.retain({"b0", "b2"})
    assert holdings.holders("k") == ["b0", "b2"] and holdings.num_held("b1") == 0
    assert holdings.knows("k")  # who showed it is about the clients, not the fleet
