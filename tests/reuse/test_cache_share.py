"""Each tenant's share of a backend's cache (``mmgate.reuse.cache_share``), judged on a real
``BackendHoldings`` record: pure, with an injected clock."""

from __future__ import annotations

import pytest

from mmgate.errors import CacheShareError
from mmgate.fleet import BackendHoldings
from mmgate.reuse.cache_share import CacheShares

A, B, C = "t" + "a" * 32, "t" + "b" * 32, "t" + "c" * 32


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class World:
    """A record of one backend's cache of ``budget`` bytes and the shares judged on it."""

    def __init__(self, budget: int = 100) -> None:
        self.clock = Clock()
        self.holdings = BackendHoldings(budget, max_entries=1000, max_keys=1000)
        self.shares = CacheShares(self.holdings, clock=self.clock)
        self.n = 0

    def send(self, tag: str, size: int) -> None:
        """``tag`` sends a new image of ``size`` and the backend answers (or it is refused)."""
        reserved = self.shares.admit("b0", tag, size)
        self.n += 1
        self.holdings.hold("b0", [(f"{tag}/{self.n}", size)])
        self.shares.release("b0", tag, reserved)
        self.shares.changed("b0")

    def use(self, tag: str, key: str) -> None:
        """``tag`` refers to an image the backend holds (a reference: nothing new)."""
        self.shares.admit("b0", tag, 0)
        self.holdings.hold("b0", [(key, dict(self.holdings.held_oldest_first("b0"))[key])])

    def held(self, tag: str) -> int:
        return sum(size for key, size in self.holdings.held_oldest_first("b0") if key.startswith(tag))


def test_one_active_tenant_is_never_refused() -> None:
    world = World()
    for _ in range(50):
        world.send(A, 30)
    assert world.held(A) == 90


def test_a_flood_past_its_share_is_refused_while_it_would_evict_the_other_tenants_images() -> None:
    world = World()
    world.send(B, 20)
    world.send(B, 20)
    for _ in range(2):
        world.send(A, 30)  # 40 + 60 = the whole cache, nothing evicted yet
    with pytest.raises(CacheShareError) as refused:
        world.send(A, 30)  # past its share of 50, and the LRU's oldest is B's
    assert refused.value.status == 429 and refused.value.code == "tenant_cache_share"
    assert 1 <= refused.value.retry_after_s <= 10
    assert world.held(B) == 40  # B's images stay held
    world.shares.admit("b0", A, 0)  # references only: never refused
    world.send(B, 20)  # B within its share: served, evicting its own oldest
    assert world.held(B) == 40


def test_a_tenant_past_its_share_turns_over_its_own_part() -> None:
    world = World()
    world.send(B, 10)
    world.send(A, 30)
    world.send(A, 30)
    world.send(A, 30)  # 100: full; A holds 90
    world.use(B, f"{B}/1")  # B's image is now the most recent: A's oldest goes first
    world.send(A, 30)  # evicts A's own oldest: served
    assert world.held(A) == 90 and world.held(B) == 10


def test_refusals_end_when_the_other_tenant_goes_idle() -> None:
    world = World()
    world.send(B, 40)
    world.send(A, 30)
    world.send(A, 30)
    with pytest.raises(CacheShareError):
        world.send(A, 30)
    world.clock.now += 61  # B idle for a whole window: A alone, never refused
    world.send(A, 30)
    assert world.held(B) == 0


def test_a_tenant_within_its_share_may_evict_the_others_excess() -> None:
    world = World(budget=90)
    for _ in range(3):
        world.send(A, 30)  # A alone: the whole cache
    world.send(B, 10)  # B, within its share: evicts A's oldest
    world.send(C, 10)  # C too
    assert world.held(B) == 10 and world.held(C) == 10 and world.held(A) == 60
    world.send(A, 30)  # A past its share of 30: served while what it evicts is its own
    assert world.held(B) == 10 and world.held(C) == 10
    world.use(A, next(k for k, _ in world.holdings.held_oldest_first("b0") if k.startswith(A)))
    with pytest.raises(CacheShareError):
        world.send(A, 30)  # now B's image is the oldest: refused


def test_requests_in_flight_count_as_held() -> None:
    world = World()
    world.send(B, 40)
    world.shares.admit("b0", A, 40)  # not answered yet
    world.shares.admit("b0", A, 20)  # 40 + 60 fills the cache: still nothing to evict
    with pytest.raises(CacheShareError):
        world.shares.admit("b0", A, 10)  # B's image would go


def test_a_backend_with_no_active_tenant_is_forgotten_within_a_window() -> None:
    # Activity is kept per backend: one that left the fleet must not stay in it (bounded by the fleet).
    world = World()
    for index in range(50):
        world.shares.admit(f"gone-{index}", A, 0)
    assert len(world.shares._seen) == 50
    world.clock.now += world.shares.window_s + 1
    world.shares.admit("b0", B, 0)
    assert list(world.shares._seen) == ["b0"]
