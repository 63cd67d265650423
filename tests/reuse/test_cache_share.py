"""The ledger of what each tenant sent into a backend's cache (``mmgate.reuse.cache_share``): pure,
with an injected clock."""

from __future__ import annotations

import pytest

from mmgate.errors import CacheShareError
from mmgate.reuse.cache_share import CacheShares

A, B, C = "t" + "a" * 32, "t" + "b" * 32, "t" + "c" * 32


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def shares(cache_bytes: int = 100, window_s: float = 60.0) -> tuple[CacheShares, Clock]:
    clock = Clock()
    return CacheShares(cache_bytes, max_entries=1000, window_s=window_s, clock=clock), clock


def test_one_active_tenant_is_never_refused() -> None:
    ledger, _ = shares()
    for _ in range(50):
        ledger.admit("b0", A, [30])
    assert ledger.sent_bytes("b0", A) <= 100  # the window holds the last cache's worth


def test_a_tenant_past_its_share_is_refused_while_another_is_active() -> None:
    ledger, clock = shares()
    ledger.admit("b0", B, [10])
    ledger.admit("b0", A, [30])
    ledger.admit("b0", A, [20])  # 50: exactly its half
    with pytest.raises(CacheShareError) as refused:
        ledger.admit("b0", A, [1])
    assert refused.value.status == 429 and refused.value.code == "tenant_cache_share"
    assert refused.value.retry_after_s == 60  # its first send must age out: it was sent just now
    assert ledger.sent_bytes("b0", A) == 50  # a refusal counts nothing
    ledger.admit("b0", A, [])  # references only: never refused
    ledger.admit("b0", B, [40])  # the other tenant within its share: served
    ledger.admit("b1", A, [30])  # another backend: a ledger of its own
    clock.now += 30
    with pytest.raises(CacheShareError) as later:
        ledger.admit("b0", A, [25])
    assert later.value.retry_after_s == 30


def test_refusals_end_when_the_sends_age_out_or_the_other_tenant_goes_idle() -> None:
    ledger, clock = shares()
    ledger.admit("b0", B, [10])
    ledger.admit("b0", A, [50])
    with pytest.raises(CacheShareError):
        ledger.admit("b0", A, [10])
    clock.now += 30
    ledger.admit("b0", B, [])  # B still active, A's sends still in the window
    with pytest.raises(CacheShareError):
        ledger.admit("b0", A, [10])
    clock.now += 31  # A's sends are past the window (B is still active: it asked 31 s ago)
    assert ledger.active_tenants("b0") == 2 and ledger.sent_bytes("b0", A) == 0
    ledger.admit("b0", A, [50])
    clock.now += 61  # B idle for a whole window: A alone, never refused
    for _ in range(5):
        ledger.admit("b0", A, [50])


def test_the_share_is_the_cache_over_the_active_tenants_and_one_request_always_passes() -> None:
    ledger, _ = shares(cache_bytes=90)
    ledger.admit("b0", B, [1])
    ledger.admit("b0", C, [1])
    ledger.admit("b0", A, [60])  # nothing of A's within the turnover: its one request passes
    with pytest.raises(CacheShareError):
        ledger.admit("b0", A, [1])
    ledger2, _ = shares(cache_bytes=90)
    ledger2.admit("b0", B, [1])
    ledger2.admit("b0", C, [1])
    ledger2.admit("b0", A, [20])
    ledger2.admit("b0", A, [10])  # 30 = 90 / 3 active tenants
    with pytest.raises(CacheShareError):
        ledger2.admit("b0", A, [1])


def test_charge_counts_without_refusing_and_the_window_is_one_cache_of_bytes() -> None:
    ledger, _ = shares()
    ledger.admit("b0", B, [10])
    ledger.admit("b0", A, [50])
    ledger.charge("b0", A, [30])  # a heal's re-send: counted, never refused
    assert ledger.sent_bytes("b0", A) == 80
    ledger.admit("b0", B, [40])  # 130 sent in all: the oldest 30 (B's 10, then A's 50) leave
    assert ledger.sent_bytes("b0", A) == 30 and ledger.sent_bytes("b0", B) == 40
