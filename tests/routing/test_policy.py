"""Routing policies without sockets: image homes, scores, bounded loads, the comparison modes.
Every policy is built from the settings the gateway ships (``GatewaySettings()``), a mode or a
load factor changed where a test says so."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from mmgate.config import GatewaySettings
from mmgate.config_routing import RoutingSettings
from mmgate.fleet import BackendHoldings, session_token
from mmgate.routing import RoutedImage, RoutingPolicy
from mmgate.routing.scheduling.filters.capacity import capacity, free_backends, spill
from mmgate.routing.scheduling.parts import REASONS, Request
from mmgate.routing.scheduling.rendezvous import rendezvous_pick
from mmgate.routing.scheduling.scorers.image_held import HELD_WEIGHT

NAMES = ["sim-0", "sim-1", "sim-2", "sim-3"]
IDLE = [0, 0, 0, 0]
SHIPPED = GatewaySettings()


def img(key: str, weight: float = 256.0) -> RoutedImage:
    return RoutedImage(key, weight)


def image_homes(images: list[RoutedImage], names: list[str]) -> list[int]:
    """Each image's home: the rendezvous winner of its key."""
    return [rendezvous_pick(image.key, names) for image in images]


def make(mode: str | None = None, seed: int = 1, **routing: object) -> RoutingPolicy:
    """A policy as the gateway builds it: the shipped settings, with ``mode``/``routing`` changed."""
    values = {**SHIPPED.routing.model_dump(), **({"mode": mode} if mode else {}), **routing}
    return RoutingPolicy(RoutingSettings(**values), BackendHoldings.for_settings(SHIPPED), rng=random.Random(seed))


def affinity(**routing: object) -> RoutingPolicy:
    return make(None, **routing)


def held(policy: RoutingPolicy, backend: str, keys: list[str], session: str | None = None) -> None:
    """``backend`` answered a request of ``session`` showing ``keys``."""
    policy.holdings.hold(backend, [(k, 1000) for k in keys])
    policy.holdings.show(keys, session_token(session))


def test_the_shipped_mode_is_image_affinity() -> None:
    assert affinity().mode == "image-affinity" and affinity().load_factor == SHIPPED.routing.load_factor


def test_independent_policies_agree_whatever_the_backend_order() -> None:
    # Three gateway processes: no shared state, backends listed in different orders.
    requests = [[img(f"pool-{i}"), img(f"pool-{i * 7 % 13}"), img(f"own-{i}")] for i in range(200)]
    orders = [NAMES, list(reversed(NAMES)), NAMES[2:] + NAMES[:2]]
    picks = []
    for names in orders:
        policy = affinity()
        picks.append([names[policy.decide(names, IDLE, None, r).order[0]] for r in requests])
    assert picks[0] == picks[1] == picks[2]


def test_single_image_goes_home_and_homes_spread() -> None:
    policy = affinity()
    homes = image_homes([img(f"k{i}") for i in range(400)], NAMES)
    for i in range(50):
        decision = policy.decide(NAMES, IDLE, None, [img(f"k{i}")])
        assert decision.order[0] == homes[i]
        assert decision.reason == "image_affinity"
    assert {homes.count(i) for i in range(4)} and min(homes.count(i) for i in range(4)) > 60


def test_weight_decides_between_homes() -> None:
    # Find two light images homed together and one heavy image homed elsewhere.
    keys = [f"k{i}" for i in range(200)]
    homes = dict(zip(keys, image_homes([img(k) for k in keys], NAMES), strict=True))
    a, b = next((x, y) for x in keys for y in keys if x < y and homes[x] == homes[y])
    heavy = next(k for k in keys if homes[k] != homes[a])
    policy = affinity()
    light_pair = [img(a, 100.0), img(b, 100.0)]
    assert policy.decide(NAMES, IDLE, None, [*light_pair, img(heavy, 150.0)]).order[0] == homes[a]
    assert policy.decide(NAMES, IDLE, None, [*light_pair, img(heavy, 250.0)]).order[0] == homes[heavy]


def test_duplicate_image_counts_once() -> None:
    keys = [f"k{i}" for i in range(200)]
    homes = dict(zip(keys, image_homes([img(k) for k in keys], NAMES), strict=True))
    a = keys[0]
    b, c = next((x, y) for x in keys for y in keys if x < y and homes[x] == homes[y] != homes[a])
    decision = affinity().decide(NAMES, IDLE, None, [img(a), img(a), img(a), img(b), img(c)])
    assert decision.order[0] == homes[b]


def test_own_images_go_to_the_session_home_shared_ones_to_theirs() -> None:
    session = "chat-1"
    session_home = affinity().decide(NAMES, IDLE, session, []).order[0]
    keys = [f"k{i}" for i in range(400)]
    homes = dict(zip(keys, image_homes([img(k) for k in keys], NAMES), strict=True))
    away = [k for k in keys if homes[k] != session_home]
    policy = affinity()
    # Never seen: the session's own image, it goes with the session.
    own = policy.decide(NAMES, IDLE, session, [img(away[0])])
    assert (own.order[0], own.reason) == (session_home, "session")
    # Seen with another session: shared, it goes to its home, from every session.
    held(policy, "sim-0", [away[0]], "another-chat")
    # (held on sim-0, its pull goes there too: above 1, a holder beats the home)
    shared = policy.decide(NAMES, IDLE, session, [img(away[0])])
    assert (shared.order[0], shared.reason) == (0, "image_affinity")
    policy.holdings.forget_backend("sim-0")
    shared = policy.decide(NAMES, IDLE, session, [img(away[0])])
    assert (shared.order[0], shared.reason) == (homes[away[0]], "image_affinity")
    # Without a session every image counts at its home.
    assert policy.decide(NAMES, IDLE, None, [img(away[1])]).order[0] == homes[away[1]]
    # Two shared images homed together outweigh one own image.
    twin = next(k for k in away[1:] if homes[k] == homes[away[0]])
    held(policy, "sim-0", [twin], "another-chat")
    policy.holdings.forget_backend("sim-0")
    mixed = policy.decide(NAMES, IDLE, session, [img(away[0]), img(twin), img("own-photo")])
    assert (mixed.order[0], mixed.reason) == (homes[away[0]], "image_affinity")
    # One shared image outweighs a never-seen one: that must be processed wherever it goes.
    fresh = policy.decide(NAMES, IDLE, session, [img(away[0]), img("brand-new-photo")])
    assert (fresh.order[0], fresh.reason) == (homes[away[0]], "image_affinity")
    # A heavier image the session sent before outweighs them (weights are tokens).
    held(policy, NAMES[session_home], ["own-scan"], session)
    heavy = policy.decide(NAMES, IDLE, session, [img(away[0]), img(twin), img("own-scan", 600.0)])
    assert (heavy.order[0], heavy.reason) == (session_home, "session")


def test_a_holder_beats_the_home() -> None:
    policy = affinity()
    home = image_homes([img("k")], NAMES)[0]
    other = (home + 1) % 4
    assert policy.decide(NAMES, IDLE, None, [img("k")]).order[0] == home
    held(policy, NAMES[other], ["k"])
    assert HELD_WEIGHT > 1
    assert policy.decide(NAMES, IDLE, None, [img("k")]).order[:2] == [other, home]
    # Forgotten there (a heal, a re-admission): home again.
    policy.holdings.forget(NAMES[other], ["k"])
    assert policy.decide(NAMES, IDLE, None, [img("k")]).order[0] == home


@pytest.mark.parametrize("load_factor", [1.0, 1.25, 1.3, 2.0])
def test_capacity_always_leaves_room_and_bounds_the_max(load_factor: float) -> None:
    rng = random.Random(5)
    for _ in range(2000):
        loads = [rng.randrange(12) for _ in range(rng.randrange(1, 6))]
        cap = capacity(loads, load_factor)
        assert any(load + 1 <= cap for load in loads)
        assert cap <= max(load_factor * (sum(loads) + 1) / len(loads), -(-(sum(loads) + 1) // len(loads)))


def test_spill_moves_the_first_backend_with_room_forward() -> None:
    order, spilled = spill([2, 0, 1, 3], [9, 0, 9, 0], 1.3)
    assert (order, spilled) == ([1, 2, 0, 3], True)  # backend 1 is the first with room
    assert spill([1, 0], [5, 0], 1.3) == ([1, 0], False)  # the preferred one has room


def test_hot_image_in_every_request_spills_within_the_bound() -> None:
    policy = affinity(load_factor=1.3)
    loads = [0, 0, 0, 0]
    hot_home = image_homes([img("hot")], NAMES)[0]
    held(policy, NAMES[hot_home], ["hot"])  # its first request was answered at home
    reasons = []
    for i in range(40):  # 40 requests in flight at once, each with the hot image
        d = policy.decide(NAMES, loads, None, [img("hot", 1000.0), img(f"own-{i}", 10.0)])
        loads[d.order[0]] += 1
        reasons.append(d.reason)
        assert max(loads) <= max(1.3 * sum(loads) / 4, -(-sum(loads) // 4))
    assert max(loads) / (sum(loads) / 4) <= 1.3
    assert loads[hot_home] == max(loads)
    assert "load_spill" in reasons and reasons[0] == "image_affinity"


def test_without_the_bound_the_hot_image_piles_up() -> None:
    # The same workload with a load factor so large it never bites: everything on one backend.
    policy = affinity(load_factor=100.0)
    held(policy, NAMES[image_homes([img("hot")], NAMES)[0]], ["hot"])
    loads = [0, 0, 0, 0]
    for i in range(40):
        loads[policy.decide(NAMES, loads, None, [img("hot", 1000.0), img(f"own-{i}", 10.0)]).order[0]] += 1
    assert max(loads) == 40


def test_a_backend_leaving_moves_only_its_images() -> None:
    images = [img(f"k{i}") for i in range(500)]
    before = [NAMES[h] for h in image_homes(images, NAMES)]
    after_names = [n for n in NAMES if n != "sim-2"]
    after = [after_names[h] for h in image_homes(images, after_names)]
    moved = [b for b, a in zip(before, after, strict=True) if b != a]
    assert moved and set(moved) == {"sim-2"}
    back = [NAMES[h] for h in image_homes(images, NAMES)]
    assert back == before


def test_round_robin_rotates() -> None:
    policy = make("round-robin")
    firsts = [policy.decide(NAMES, IDLE, "s", [img("k")]).order[0] for _ in range(8)]
    assert firsts == [0, 1, 2, 3, 0, 1, 2, 3]


def test_session_mode_is_todays_routing() -> None:
    policy = make("session", seed=2)
    d = policy.decide(NAMES, IDLE, "chat-9", [img("k")])
    assert d.reason == "session"
    assert {policy.decide(NAMES, IDLE, "chat-9", [img(f"x{i}")]).order[0] for i in range(20)} == {d.order[0]}
    assert policy.decide(NAMES, [5, 0, 5, 5], None, [img("k")]).reason == "least_loaded"


def test_lru_history_prefers_holders_then_the_least_loaded() -> None:
    """The llm-d-like baseline, a profile selected by name like the others."""
    policy = make("lru-history", seed=3)
    cold = policy.decide(NAMES, [3, 1, 0, 2], None, [img("a")])
    assert (cold.order[0], cold.reason) == (2, "least_loaded")
    held(policy, "sim-1", ["a", "b"])
    warm = policy.decide(NAMES, [3, 1, 0, 2], None, [img("a"), img("b")])
    assert (warm.order[0], warm.reason) == (1, "image_affinity")
    # Its load score pulls away from a holder that is the most loaded.
    busy = policy.decide(NAMES, [0, 9, 0, 0], None, [img("a"), img("z1"), img("z2")])
    assert busy.order[0] != 1


def test_reasons_are_the_bounded_set() -> None:
    rng = random.Random(9)
    for mode in ("round-robin", "session", "image-affinity", "lru-history"):
        policy = make(mode, seed=rng.randrange(100))
        for i in range(50):
            loads = [rng.randrange(5) for _ in NAMES]
            d = policy.decide(NAMES, loads, f"s{i % 3}" if i % 2 else None, [img(f"k{i % 7}")][: i % 2 + 1])
            assert d.reason in REASONS
            assert sorted(d.order) == [0, 1, 2, 3]


def test_bad_settings() -> None:
    with pytest.raises(ValidationError):
        make("sticky")
    with pytest.raises(ValidationError):
        affinity(load_factor=0.9)


def test_a_request_several_backends_hold_goes_to_the_least_loaded_of_them() -> None:
    policy = affinity()
    images = [img("seen-a"), img("seen-b"), img("never-shown")]
    held(policy, "sim-1", ["seen-a", "seen-b"])
    held(policy, "sim-3", ["seen-a", "seen-b"])
    held(policy, "sim-0", ["seen-a"])  # holds only one: it would process seen-b again
    assert free_backends(Request(NAMES, IDLE, None, images, policy.holdings, 1.3, random.Random(1))) == [1, 3]
    for loads, first in (([1, 2, 1, 1], 3), ([1, 1, 1, 2], 1)):  # under the cap (2) either way
        decision = policy.decide(NAMES, loads, None, images)
        assert decision.order[0] == first, (loads, decision)
