"""Which images are popular enough to be held everywhere: a decayed share of recent requests.

An image shown in a large share of the requests (a hot system-prompt image, the head of a
catalogue) ends up processed on every backend whatever the routing does: each backend takes some of
its requests. So routing by its home only piles load there and pulls its requests away from their
rarer images' homes. ``ImagePopularity`` counts, per gateway and with no coordination, the share
of recent requests that showed each image key: a count per key and a count of requests, both
decayed by half every ``half_life`` requests (lazily: a key's count is brought up to date when it
is touched). An image whose share reaches ``replicate_share`` (and that was seen at least
``MIN_SIGHTINGS`` times) is *replicated*: ``image-affinity`` stops weighing it, so its requests go
by their other images and it costs at most one copy per backend. It stays replicated until its
share falls below ``HYSTERESIS`` x ``replicate_share``: gateways' counts differ a little (each sees
its own share of the traffic), and a threshold with a gap keeps them from flapping across it.

Bounded: at most ``max_keys`` keys (least recently seen out), and a key whose decayed count has
fallen below ``FORGET_BELOW`` is dropped when it reaches the old end. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

HYSTERESIS = 0.5
MIN_SIGHTINGS = 4
FORGET_BELOW = 0.05


class _Count:
    __slots__ = ("count", "replicated", "sightings", "tick")

    def __init__(self, tick: int) -> None:
        self.count = 0.0
        self.sightings = 0
        self.tick = tick
        self.replicated = False


class ImagePopularity:
    """Decayed share of recent requests per image key, and the replicated ones (with hysteresis)."""

    def __init__(self, replicate_share: float, *, half_life: float = 1000.0, max_keys: int = 100_000) -> None:
        if not 0 < replicate_share <= 1:
            raise ValueError("replicate_share must be in (0, 1]")
        if half_life <= 0 or max_keys < 1:
            raise ValueError("half_life must be positive and max_keys at least 1")
        self.replicate_share = replicate_share
        self.half_life = half_life
        self.max_keys = max_keys
        self._decay = 0.5 ** (1.0 / half_life)
        self._tick = 0
        self._requests = 0.0
        self._counts: OrderedDict[str, _Count] = OrderedDict()
        self.replicated_count = 0

    def __len__(self) -> int:
        return len(self._counts)

    @property
    def requests(self) -> float:
        """Requests observed, decayed."""
        return self._requests

    def observe(self, keys: Iterable[str]) -> None:
        """One request showed ``keys`` (an image twice in a request counts once)."""
        self._tick += 1
        self._requests = self._requests * self._decay + 1.0
        for key in dict.fromkeys(keys):
            entry = self._counts.get(key)
            if entry is None:
                entry = self._counts[key] = _Count(self._tick)
            else:
                self._counts.move_to_end(key)
            was = entry.replicated
            before = self._decayed(entry)
            entry.replicated = self._state(entry, before)  # what is_replicated said until now
            entry.count = before + 1.0
            entry.sightings = min(entry.sightings + 1, MIN_SIGHTINGS)
            entry.tick = self._tick
            entry.replicated = self._state(entry, entry.count)
            self.replicated_count += int(entry.replicated) - int(was)
        self._trim()

    def count(self, key: str) -> float:
        """Requests that showed ``key``, decayed (0 for an unknown key)."""
        entry = self._counts.get(key)
        return self._decayed(entry) if entry is not None else 0.0

    def share(self, key: str) -> float:
        """Share of recent requests that showed ``key`` (0..1)."""
        return self.count(key) / self._requests if self._requests > 0 else 0.0

    def is_replicated(self, key: str) -> bool:
        """True when ``key`` is shown so often that it is expected on every backend: at or above
        ``replicate_share`` (seen ``MIN_SIGHTINGS`` times), or replicated at its last sighting and
        still above ``HYSTERESIS`` x ``replicate_share``."""
        entry = self._counts.get(key)
        if entry is None:
            return False
        return self._state(entry, self._decayed(entry))

    def _state(self, entry: _Count, count: float) -> bool:
        share = count / self._requests if self._requests > 0 else 0.0
        if share >= self.replicate_share and entry.sightings >= MIN_SIGHTINGS:
            return True
        return entry.replicated and share >= HYSTERESIS * self.replicate_share

    def _decayed(self, entry: _Count) -> float:
        return entry.count * self._decay ** (self._tick - entry.tick)

    def _trim(self) -> None:
        while self._counts:
            key, oldest = next(iter(self._counts.items()))
            if len(self._counts) <= self.max_keys and self._decayed(oldest) >= FORGET_BELOW:
                return
            self.replicated_count -= int(oldest.replicated)
            del self._counts[key]
