"""The processor cache: an LRU bounded by bytes, like vLLM's multimodal processor cache.

Plain class, no event loop: the engine calls it from the loop thread only.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class ProcessedImage:
    """What the HF-processor stand-in produced for one image.

    ``pixel_values`` holds the normalised float32 patches, one row per 14x14 patch (Qwen2-VL's
    layout without the temporal duplication); ``num_tokens`` is what the image adds to the prompt.
    """

    pixel_values: np.ndarray
    grid_h: int
    grid_w: int
    num_tokens: int

    @property
    def num_bytes(self) -> int:
        return int(self.pixel_values.nbytes)


class ProcessorCache:
    """LRU of processed images keyed by uuid or content hash, bounded by ``capacity_bytes``.

    An item larger than the whole capacity is not stored. A capacity of 0 stores nothing.
    """

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = max(0, capacity_bytes)
        self._items: OrderedDict[str, ProcessedImage] = OrderedDict()
        self.num_cached_bytes = 0
        self.num_evictions = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def get(self, key: str) -> ProcessedImage | None:
        """The item (now most recently used), or None."""
        item = self._items.get(key)
        if item is not None:
            self._items.move_to_end(key)
        return item

    def put(self, key: str, item: ProcessedImage) -> bool:
        """Insert or replace; evict least recently used items to fit. False when not stored."""
        size = item.num_bytes
        if size > self.capacity_bytes:
            return False
        old = self._items.pop(key, None)
        if old is not None:
            self.num_cached_bytes -= old.num_bytes
        while self._items and self.num_cached_bytes + size > self.capacity_bytes:
            _, evicted = self._items.popitem(last=False)
            self.num_cached_bytes -= evicted.num_bytes
            self.num_evictions += 1
        self._items[key] = item
        self.num_cached_bytes += size
        return True

    def clear(self) -> None:
        self._items.clear()
        self.num_cached_bytes = 0
