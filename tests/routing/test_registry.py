"""The scheduling's registry of named parts: every ``--routing`` value names a profile of
registered parts, a name is registered once, and a new scorer is one registration away from
a profile that uses it. Pure: no sockets."""

from __future__ import annotations

import random
import typing

import pytest

from mmgate.config import GatewaySettings
from mmgate.config_routing import RoutingSettings
from mmgate.fleet import BackendHoldings
from mmgate.routing import RoutedImage, RoutingPolicy
from mmgate.routing.scheduling.parts import (
    FILTERS,
    PICKERS,
    PROFILES,
    SCORERS,
    Profile,
    Request,
    Scorer,
    register,
)
from tests.test_layout import SRC, find_cycle, imports

NAMES = ["sim-0", "sim-1", "sim-2"]
SHIPPED = GatewaySettings()


def policy(profile: str | None = None, mode: str = "image-affinity") -> RoutingPolicy:
    return RoutingPolicy(RoutingSettings(mode=mode), BackendHoldings.for_settings(SHIPPED), rng=random.Random(1),
                         profile=profile)


def test_every_routing_mode_names_a_profile_of_registered_parts() -> None:
    modes = typing.get_args(RoutingSettings.model_fields["mode"].annotation)
    assert set(modes) <= set(PROFILES)
    for mode in modes:
        parts = PROFILES[mode]
        assert all(n in FILTERS for n in parts.filters) and all(n in SCORERS for n in parts.scorers)
        assert parts.picker in PICKERS
        assert parts.filters[:2] == ("model", "health")  # every profile fails open the same way


def test_a_name_is_registered_once() -> None:
    with pytest.raises(ValueError, match="registered already"):
        register(SCORERS, "load", SCORERS["load"])
    with pytest.raises(ValueError, match="unregistered parts"):
        register(PROFILES, "typo", Profile(("model",), ("no-such-scorer",), "highest-score"))
    assert "typo" not in PROFILES


def test_a_new_scorer_is_one_registration(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scorer that pulls every request to the last candidate, in a profile of its own."""
    monkeypatch.setitem(SCORERS, "last", Scorer(lambda r: [float(i) for i in range(len(r.names))], reason="session"))
    monkeypatch.setitem(PROFILES, "last", Profile(("model", "health"), ("last",), "highest-score"))
    chosen = policy("last").decide(NAMES, [0, 0, 0], None, [RoutedImage("k", 1.0)])
    assert (chosen.order, chosen.reason) == ([2, 1, 0], "session")
    # The settings' mode still names the profile when none is given.
    assert policy(mode="round-robin").decide(NAMES, [0, 0, 0], None).reason == "round_robin"


def test_the_load_scorer_is_llm_ds_queue_scorer() -> None:
    request = Request(NAMES, [4, 0, 2], None, [], BackendHoldings.for_settings(SHIPPED), 1.3, random.Random(1))
    assert SCORERS["load"].score(request) == [0.0, 1.0, 0.5]
    request.loads = [3, 3, 3]
    assert SCORERS["load"].score(request) == [1.0, 1.0, 1.0]


def test_no_import_cycle_between_the_routing_modules() -> None:
    """tests/test_layout.py checks the packages; inside routing each module counts."""
    graph: dict[str, set[str]] = {}
    for found in imports(SRC):
        if found.module.startswith("mmgate.routing") and found.target.startswith("mmgate.routing"):
            graph.setdefault(found.module, set()).add(found.target)
    assert graph and find_cycle(graph) is None
