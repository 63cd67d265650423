"""Routing policies without sockets: image homes, scores, bounded loads, the comparison modes."""

from __future__ import annotations

import random

import pytest

from mmgate.routing.history import ImageHistory
from mmgate.routing.policy import (
    REASONS,
    RoutingPolicy,
    bounded_capacity,
    image_homes,
    spill,
)
from mmgate.routing.weights import RoutedImage

NAMES = ["sim-0", "sim-1", "sim-2", "sim-3"]
IDLE = [0, 0, 0, 0]


def img(key: str, weight: float = 256.0) -> RoutedImage:
    return RoutedImage(key, weight)


def affinity(**kwargs: object) -> RoutingPolicy:
    return RoutingPolicy("image-affinity", rng=random.Random(1), **kwargs)  # type: ignore[arg-type]


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
    policy.history.record("sim-0", [away[0]], "another-chat")
    shared = policy.decide(NAMES, IDLE, session, [img(away[0])])
    assert (shared.order[0], shared.reason) == (homes[away[0]], "image_affinity")
    # Without a session every image counts at its home.
    assert policy.decide(NAMES, IDLE, None, [img(away[1])]).order[0] == homes[away[1]]
    # Two shared images homed together outweigh one own image.
    twin = next(k for k in away[1:] if homes[k] == homes[away[0]])
    policy.history.record("sim-0", [twin], "another-chat")
    mixed = policy.decide(NAMES, IDLE, session, [img(away[0]), img(twin), img("own-photo")])
    assert (mixed.order[0], mixed.reason) == (homes[away[0]], "image_affinity")
    # One shared image outweighs a never-seen one: that must be processed wherever it goes.
    fresh = policy.decide(NAMES, IDLE, session, [img(away[0]), img("brand-new-photo")])
    assert (fresh.order[0], fresh.reason) == (homes[away[0]], "image_affinity")
    # A heavier image the session sent before outweighs them (weights are tokens).
    policy.history.record(NAMES[session_home], ["own-scan"], session)
    heavy = policy.decide(NAMES, IDLE, session, [img(away[0]), img(twin), img("own-scan", 600.0)])
    assert (heavy.order[0], heavy.reason) == (session_home, "session")


def test_held_images_count_when_asked() -> None:
    history = ImageHistory()
    home = image_homes([img("k")], NAMES)[0]
    other = (home + 1) % 4
    history.record(NAMES[other], ["k"])
    assert affinity(history=history).decide(NAMES, IDLE, None, [img("k")]).order[0] == home
    # Held counts as much as home: a tie, broken by the image's rendezvous order (home first)...
    tied = affinity(history=history, held_weight=1.0).decide(NAMES, IDLE, None, [img("k")])
    assert tied.order[:2] == [home, other] or tied.order[:2] == [other, home]
    # ...and a second held image tips it.
    history.record(NAMES[other], ["k2"])
    tipped = affinity(history=history, held_weight=1.0).decide(NAMES, IDLE, None, [img("k"), img("k2")])
    assert tipped.order[0] == other


@pytest.mark.parametrize("load_factor", [1.0, 1.25, 1.3, 2.0])
def test_capacity_always_leaves_room_and_bounds_the_max(load_factor: float) -> None:
    rng = random.Random(5)
    for _ in range(2000):
        loads = [rng.randrange(12) for _ in range(rng.randrange(1, 6))]
        cap = bounded_capacity(loads, load_factor)
        assert any(load + 1 <= cap for load in loads)
        assert cap <= max(load_factor * (sum(loads) + 1) / len(loads), -(-(sum(loads) + 1) // len(loads)))


def test_random_rounding_caps_at_the_factor_times_the_mean_on_average() -> None:
    # 8 in flight on 4 backends once placed: 1.3 x 2 = 2.6. Rounded down the cap is the mean itself.
    loads = [2, 2, 2, 1]
    assert bounded_capacity(loads, 1.3) == 2
    assert bounded_capacity(loads, 1.3, draw=0.59) == 3 and bounded_capacity(loads, 1.3, draw=0.61) == 2
    rng = random.Random(3)
    caps = [bounded_capacity(loads, 1.3, rng.random()) for _ in range(4000)]
    assert 2.55 < sum(caps) / len(caps) < 2.65
    # Never below ceil(mean): some backend always has room, whatever the draw.
    assert bounded_capacity([1, 1, 1, 1], 1.0, draw=0.99) == 2


@pytest.mark.parametrize("rounding", ["down", "random"])
def test_load_rounding_decides_how_often_a_request_spills_at_small_counts(rounding: str) -> None:
    # The image's home holds 2 of 7 in flight: rounded down it is full (cap 2), rounded at random
    # it has room 6 times in 10 (cap 3 with the fraction 0.6 of 2.6).
    key = "pool-3"
    home = image_homes([img(key)], NAMES)[0]
    loads = [1, 1, 1, 1]
    loads[home] = 2
    loads[(home + 1) % 4] = 2
    loads[(home + 2) % 4] = 2
    policy = affinity(load_rounding=rounding)
    stays = sum(policy.decide(NAMES, loads, None, [img(key)]).order[0] == home for _ in range(2000)) / 2000
    if rounding == "down":
        assert stays == 0
    else:
        assert 0.55 < stays < 0.65, stays


def test_an_unknown_load_rounding_is_refused() -> None:
    with pytest.raises(ValueError, match="load rounding"):
        RoutingPolicy("image-affinity", load_rounding="up")  # type: ignore[arg-type]


def test_spill_moves_the_first_backend_with_room_forward() -> None:
    order, spilled = spill([2, 0, 1, 3], [9, 0, 9, 0], 1.3)
    assert (order, spilled) == ([1, 2, 0, 3], True)  # backend 1 is the first with room
    assert spill([1, 0], [5, 0], 1.3) == ([1, 0], False)  # the preferred one has room


def test_with_the_fleet_load_a_backend_needs_room_by_both_counts() -> None:
    # Own counts say backend 0 has room; the fleet's (other gateways' requests) say it has none.
    order, spilled = spill([0, 1, 2, 3], [0, 0, 0, 0], 1.3, fleet=[6, 2, 1, 1])
    assert (order[0], spilled) == (1, True)
    # One request (maybe ended since the poll) on an idle fleet is within the slack: no spill.
    assert spill([0, 1, 2, 3], [0, 0, 0, 0], 1.3, fleet=[1, 0, 0, 0]) == ([0, 1, 2, 3], False)
    # The fleet has room on 0 but this gateway alone already holds its share there: 1 is next.
    order, spilled = spill([0, 1, 2, 3], [2, 0, 0, 0], 1.3, fleet=[2, 2, 2, 2])
    assert (order[0], spilled) == (1, True)
    # No backend has room by both: the fleet's count decides.
    order, _ = spill([0, 1, 2, 3], [0, 3, 3, 3], 1.3, fleet=[9, 9, 0, 9])
    assert order[0] == 2
    assert spill([0, 1], [0, 0], 1.3, fleet=[0, 0]) == ([0, 1], False)


def test_decide_balances_by_the_fleet_load_when_it_is_known() -> None:
    policy = RoutingPolicy("image-affinity")
    names = ["b0", "b1", "b2", "b3"]
    image = RoutedImage("~sha256:hot", 256.0)
    home = policy.decide(names, [0] * 4, None, [image]).order[0]
    fleet = [0] * 4
    fleet[home] = 8
    decision = policy.decide(names, [0] * 4, None, [image], fleet_loads=fleet)
    assert decision.order[0] != home and decision.reason == "load_spill"
    sessionless = RoutingPolicy("session", rng=random.Random(1))
    assert sessionless.decide(["a", "b"], [0, 0], None, fleet_loads=[5, 0]).order[0] == 1


def test_hold_overflow_keeps_a_request_where_its_images_are_one_request_over_the_cap() -> None:
    names = ["b0", "b1", "b2", "b3"]
    seen = RoutedImage("~sha256:seen", 256.0)
    for overflow, stays in ((0, False), (1, True)):
        policy = RoutingPolicy("image-affinity", held_weight=1.0, hold_overflow=overflow)
        home = policy.decide(names, [0] * 4, None, [seen]).order[0]
        policy.history.record(names[home], [seen.key])
        loads = [0] * 4
        loads[home] = 1  # the cap is 1 (2 in flight over 4), and no other backend holds the image
        decision = policy.decide(names, loads, None, [seen])
        assert (decision.order[0] == home) is stays, (overflow, decision)
        loads[home] = 2  # past the cap + 1: spills whatever the overflow
        assert policy.decide(names, loads, None, [seen]).order[0] != home
    # A spill target that holds the image too costs nothing: the cap stays strict.
    policy = RoutingPolicy("image-affinity", held_weight=1.0, hold_overflow=1)
    home = policy.decide(names, [0] * 4, None, [seen]).order[0]
    for b in names:
        policy.history.record(b, [seen.key])
    loads = [0] * 4
    loads[home] = 1
    assert policy.decide(names, loads, None, [seen]).order[0] != home
    with pytest.raises(ValueError):
        RoutingPolicy("image-affinity", hold_overflow=-1)


def test_hot_image_in_every_request_spills_within_the_bound() -> None:
    policy = affinity(load_factor=1.3)
    loads = [0, 0, 0, 0]
    hot_home = image_homes([img("hot")], NAMES)[0]
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
    policy = affinity(load_factor=1000.0)
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
    policy = RoutingPolicy("round-robin")
    firsts = [policy.decide(NAMES, IDLE, "s", [img("k")]).order[0] for _ in range(8)]
    assert firsts == [0, 1, 2, 3, 0, 1, 2, 3]


def test_session_mode_is_todays_routing() -> None:
    policy = RoutingPolicy("session", rng=random.Random(2))
    d = policy.decide(NAMES, IDLE, "chat-9", [img("k")])
    assert d.reason == "session"
    assert {policy.decide(NAMES, IDLE, "chat-9", [img(f"x{i}")]).order[0] for i in range(20)} == {d.order[0]}
    assert policy.decide(NAMES, [5, 0, 5, 5], None, [img("k")]).reason == "least_loaded"


def test_lru_history_prefers_holders_then_the_least_loaded() -> None:
    history = ImageHistory()
    policy = RoutingPolicy("lru-history", history=history, rng=random.Random(3))
    cold = policy.decide(NAMES, [3, 1, 0, 2], None, [img("a")])
    assert (cold.order[0], cold.reason) == (2, "least_loaded")
    history.record("sim-1", ["a", "b"])
    warm = policy.decide(NAMES, [3, 1, 0, 2], None, [img("a"), img("b")])
    assert (warm.order[0], warm.reason) == (1, "image_history")
    # Its load score pulls away from a holder that is the most loaded.
    busy = policy.decide(NAMES, [0, 9, 0, 0], None, [img("a"), img("z1"), img("z2")])
    assert busy.order[0] != 1


def test_reasons_are_the_bounded_set() -> None:
    rng = random.Random(9)
    for mode in ("round-robin", "session", "lru-history", "image-affinity"):
        policy = RoutingPolicy(mode, rng=rng)
        for i in range(50):
            loads = [rng.randrange(5) for _ in NAMES]
            d = policy.decide(NAMES, loads, f"s{i % 3}" if i % 2 else None, [img(f"k{i % 7}")][: i % 2 + 1])
            assert d.reason in REASONS
            assert sorted(d.order) == [0, 1, 2, 3]


def test_bad_settings() -> None:
    with pytest.raises(ValueError):
        RoutingPolicy("sticky")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        RoutingPolicy("image-affinity", load_factor=0.9)
