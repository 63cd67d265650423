"""ByteLRU: byte bound, entry cap, recency, TTL (pure: no event loop)."""

from __future__ import annotations

import pytest

from mmgate.store.lru import ByteLRU


def _lru(max_bytes: int, **kw: object) -> ByteLRU[str, bytes]:
    return ByteLRU(max_bytes, size_of=len, **kw)  # type: ignore[arg-type]


def test_total_bytes_stay_under_cap_and_oldest_goes_first() -> None:
    lru = _lru(100)
    for i in range(10):
        assert lru.put(f"k{i}", b"x" * 25)
        assert lru.num_cached_bytes <= 100
    assert len(lru) == 4
    assert lru.num_cached_bytes == 100
    assert [k for k in ("k6", "k7", "k8", "k9") if lru.get(k) is not None] == ["k6", "k7", "k8", "k9"]
    assert lru.get("k5") is None


def test_get_refreshes_recency() -> None:
    lru = _lru(75)
    lru.put("a", b"1" * 25)
    lru.put("b", b"2" * 25)
    lru.put("c", b"3" * 25)
    assert lru.get("a") == b"1" * 25
    lru.put("d", b"4" * 25)  # evicts b, the least recently used, not a
    assert "a" in lru and "b" not in lru and "c" in lru and "d" in lru


def test_entry_over_fraction_is_not_cached_and_drops_stale_value() -> None:
    lru = _lru(100, max_entry_bytes=25)
    assert lru.put("k", b"s" * 10)
    assert not lru.put("k", b"b" * 26)
    assert "k" not in lru
    assert lru.num_cached_bytes == 0


def test_replace_and_pop_keep_byte_count_exact() -> None:
    lru = _lru(100)
    lru.put("k", b"x" * 30)
    lru.put("k", b"y" * 10)
    assert lru.num_cached_bytes == 10 and len(lru) == 1
    assert lru.pop("k") == b"y" * 10
    assert lru.pop("k") is None
    assert lru.num_cached_bytes == 0 and len(lru) == 0


def test_zero_capacity_caches_nothing() -> None:
    lru = _lru(0)
    assert not lru.put("k", b"x")
    assert len(lru) == 0


def test_ttl_expires_entries() -> None:
    now = [0.0]
    lru = _lru(100, ttl_s=10.0, clock=lambda: now[0])
    lru.put("k", b"x" * 5)
    now[0] = 9.9
    assert lru.get("k") == b"x" * 5
    now[0] = 10.0
    assert lru.get("k") is None
    assert lru.num_cached_bytes == 0


def test_negative_capacity_is_refused() -> None:
    with pytest.raises(ValueError):
        _lru(-1)
