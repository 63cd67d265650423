"""``image-affinity`` with image popularity and held balance, without sockets: a replicated image
stops pulling, the rarer image's home wins, independent gateways fed the same traffic still agree,
and a request several backends hold goes to the least loaded of them."""

from __future__ import annotations

import random
from collections import Counter

from mmgate.routing.affinity import free_backends, image_homes
from mmgate.routing.policy import RoutingPolicy
from mmgate.routing.popularity import ImagePopularity
from mmgate.routing.weights import RoutedImage

NAMES = ["sim-0", "sim-1", "sim-2", "sim-3"]
IDLE = [0, 0, 0, 0]


def img(key: str, weight: float = 256.0) -> RoutedImage:
    return RoutedImage(key, weight)


def policy(share: float | None = 0.25, *, seed: int = 1, load_factor: float = 1.3,
           held_balance: bool = False) -> RoutingPolicy:
    popularity = ImagePopularity(share, half_life=1e6) if share is not None else None
    return RoutingPolicy("image-affinity", held_weight=1.0, load_factor=load_factor, popularity=popularity,
                         rng=random.Random(seed), held_balance=held_balance)


def send(p: RoutingPolicy, images: list[RoutedImage], session: str | None = None,
         loads: list[int] = IDLE) -> int:
    """Decide, then record as the router does; the chosen backend's index."""
    choice = p.decide(NAMES, loads, session, images).order[0]
    p.history.record(NAMES[choice], [i.key for i in images], session)
    assert p.popularity is not None
    p.popularity.observe(i.key for i in images)
    return choice


def test_a_replicated_image_stops_pulling_its_requests_home() -> None:
    hot_home = image_homes([img("hot")], NAMES)[0]
    rare = [f"rare-{i}" for i in range(40)]
    rare_homes = image_homes([img(k) for k in rare], NAMES)
    with_popularity = policy()
    picks = [send(with_popularity, [img("hot", 1024.0), img(k, 64.0)]) for k in rare]
    # After a few requests the hot image is replicated and each request goes to its rare image's home.
    assert with_popularity.popularity is not None and with_popularity.popularity.is_replicated("hot")
    assert picks[8:] == rare_homes[8:]
    assert len(set(picks[8:])) == 4
    # Without popularity the heavier hot image decides every time (an idle fleet: no spill).
    without = policy(None)
    assert {without.decide(NAMES, IDLE, None, [img("hot", 1024.0), img(k, 64.0)]).order[0] for k in rare} == {hot_home}


def test_only_replicated_images_and_no_session_balance_by_load() -> None:
    p = policy()
    for i in range(10):
        send(p, [img("hot"), img(f"warm-{i % 2}")])
    assert p.popularity is not None and p.popularity.is_replicated("warm-0")
    decisions = [p.decide(NAMES, [5, 5, 0, 0], None, [img("hot"), img("warm-0")]) for _ in range(60)]
    assert {d.reason for d in decisions} == {"least_loaded"}
    picks = Counter(d.order[0] for d in decisions)  # the less loaded of two random picks
    assert picks[2] > 0 and picks[3] > 0 and picks[2] + picks[3] >= 40, picks


def test_the_rarer_image_home_wins_and_the_popular_one_is_copied_there() -> None:
    keys = [f"k{i}" for i in range(200)]
    homes = dict(zip(keys, image_homes([img(k) for k in keys], NAMES), strict=True))
    popular = keys[0]
    rare = next(k for k in keys[1:] if homes[k] != homes[popular])
    p = policy(0.9)  # popular but below the replication share: it still pulls, less than a rare one
    for i in range(30):  # in 2 requests of 3
        send(p, [img(popular)] if i % 3 else [img(f"x{i}")])
    send(p, [img(rare), img("filler")])
    assert p.popularity is not None and not p.popularity.is_replicated(popular)
    # The same two images in either order: the rarer one's home.
    assert send(p, [img(popular), img(rare)]) == homes[rare]
    assert p.decide(NAMES, IDLE, None, [img(rare), img(popular)]).order[0] == homes[rare]


def test_a_hot_image_with_only_new_images_of_a_session_is_bounded() -> None:
    # A session's first turns (new images only) stay at the session home unbounded, as before...
    p = policy()
    session_home = p.decide(NAMES, IDLE, "chat", [img("new-0")]).order[0]
    full = [0, 0, 0, 0]
    full[session_home] = 9
    assert p.decide(NAMES, full, "chat", [img("new-1")]).reason == "session"
    # ...but with a replicated image beside them the cap applies (or a hot image's turns pile up
    # on sessions' homes): the request spills.
    for i in range(8):
        send(p, [img("hot"), img(f"other-{i}")], f"s{i}")
    d = p.decide(NAMES, full, "chat", [img("hot"), img("new-2")])
    assert d.reason == "load_spill" and d.order[0] != session_home
    # A conversation (an own image sent before) still stays home.
    p.history.record(NAMES[session_home], ["own-photo"], "chat")
    assert p.decide(NAMES, full, "chat", [img("hot"), img("own-photo")]).reason == "session"


def test_three_gateways_fed_the_same_traffic_agree_and_spread_the_hot_image() -> None:
    requests = [[img("hot", 1024.0), img(f"pool-{i % 11}"), img(f"own-{i}")] for i in range(120)]
    gateways = [policy(seed=s) for s in (1, 2, 3)]
    picks = [[send(g, r) for r in requests] for g in gateways]
    assert picks[0] == picks[1] == picks[2]
    counts = Counter(picks[0][20:])
    assert len(counts) == 4 and max(counts.values()) < 0.5 * 100, counts


def test_free_backends_hold_every_seen_image_that_is_not_replicated() -> None:
    p = policy()
    assert p.popularity is not None
    p.history.record("sim-1", ["a", "b"])
    p.history.record("sim-2", ["a", "b"])
    p.history.record("sim-3", ["a"])
    assert free_backends([img("a"), img("b"), img("never-seen")], NAMES, p.history, p.popularity) == [1, 2]
    assert free_backends([img("a")], NAMES, p.history, p.popularity) == [1, 2, 3]
    assert free_backends([img("never-seen")], NAMES, p.history, p.popularity) == [0, 1, 2, 3]
    for _ in range(6):
        p.popularity.observe(["b"])
    assert free_backends([img("b")], NAMES, p.history, p.popularity) == [0, 1, 2, 3]  # replicated


def test_held_balance_sends_a_request_several_backends_hold_to_the_least_loaded() -> None:
    keys = [f"k{i}" for i in range(200)]
    homes = dict(zip(keys, image_homes([img(k) for k in keys], NAMES), strict=True))
    key = keys[0]
    other = (homes[key] + 1) % 4
    loads = [2, 2, 2, 2]
    loads[homes[key]], loads[other] = 1, 0  # the home is busier than the other holder, but has room
    for balanced in (False, True):
        p = policy(held_balance=balanced)
        for backend in (homes[key], other):
            p.history.record(NAMES[backend], [key], "another-chat")
        d = p.decide(NAMES, loads, None, [img(key), img("never-seen")])
        assert d.order[0] == (other if balanced else homes[key]), (balanced, d)
        assert d.reason == "image_affinity"
    # Held by its home alone: no choice to make, it goes home.
    lone = keys[1]
    p = policy(held_balance=True)
    p.history.record(NAMES[homes[lone]], [lone], "another-chat")
    busy = [2, 2, 2, 2]
    busy[homes[lone]], busy[(homes[lone] + 1) % 4] = 1, 0
    assert free_backends([img(lone)], NAMES, p.history, p.popularity) == [homes[lone]]
    assert p.decide(NAMES, busy, None, [img(lone)]).order[0] == homes[lone]


def test_above_one_the_held_weight_makes_a_holder_beat_the_home() -> None:
    home = image_homes([img("k")], NAMES)[0]
    other = (home + 1) % 4
    for held_weight, expected in ((1.0, home), (1.2, other)):
        p = RoutingPolicy("image-affinity", held_weight=held_weight, rng=random.Random(1))
        p.history.record(NAMES[other], ["k"], "another-chat")  # sent away from its home before
        assert p.decide(NAMES, IDLE, None, [img("k")]).order[0] == expected, held_weight


def test_a_conversation_stays_home_whatever_the_held_weight() -> None:
    # A session's own image held at its home pulls for the session, not against it: with a held
    # weight above 1 the conversation still stays home (unbounded), as session routing does.
    for held_weight in (0.0, 1.0, 1.2, 4.0):
        p = RoutingPolicy("image-affinity", held_weight=held_weight, rng=random.Random(1))
        home = p.decide(NAMES, IDLE, "chat", [img("photo")]).order[0]
        p.history.record(NAMES[home], ["photo"], "chat")
        full = [0, 0, 0, 0]
        full[home] = 9
        d = p.decide(NAMES, full, "chat", [img("photo"), img("new-photo")])
        assert (d.order[0], d.reason) == (home, "session"), held_weight
