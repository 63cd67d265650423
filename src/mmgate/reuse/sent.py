"""Which uuids each backend was sent with data, so repeats can go as cache-only references.

Per backend, a byte-bounded LRU of uuid → estimated processed size, sized to the backend's
processor-cache budget: what the gateway believes the backend still holds. The estimate can be
wrong (the backend restarted, evicted sooner); a wrong guess costs one healed cache miss, after
which the keys of that request are forgotten for that backend (``forget``).
"""

from __future__ import annotations

from mmgate.store import ByteLRU

# vLLM's processor cache holds pixel tensors: about 3 float32 values per pixel after resize.
PROCESSED_BYTES_PER_PIXEL = 12


def estimated_processed_bytes(width: int, height: int, max_pixels: int) -> int:
    return PROCESSED_BYTES_PER_PIXEL * min(width * height, max_pixels) + 1024


class SentTracker:
    """Per-backend memory of uuids sent with data."""

    def __init__(self, budget_bytes: int, *, max_pixels: int = 1280 * 28 * 28, max_entries: int = 65536) -> None:
        self.budget_bytes = budget_bytes
        # The gateway's own memory: ~250 bytes an entry, so at most ~16 MiB per backend by default
        # (the byte budget models the backend's cache, not this process).
        self.max_entries = max_entries
        self.max_pixels = max_pixels
        self._per_backend: dict[str, ByteLRU[str, int]] = {}

    def _lru(self, backend: str) -> ByteLRU[str, int]:
        lru = self._per_backend.get(backend)
        if lru is None:
            lru = ByteLRU(self.budget_bytes, size_of=int, max_entries=self.max_entries)
            self._per_backend[backend] = lru
        return lru

    def was_sent(self, backend: str, uuid: str) -> bool:
        """True when ``backend`` should still hold ``uuid`` (and refreshes its recency)."""
        return self._lru(backend).get(uuid) is not None

    def mark_sent(self, backend: str, uuid: str, width: int, height: int) -> None:
        self._lru(backend).put(uuid, estimated_processed_bytes(width, height, self.max_pixels))

    def forget(self, backend: str, uuid: str) -> None:
        self._lru(backend).pop(uuid)

    def num_tracked(self, backend: str) -> int:
        return len(self._lru(backend))
