"""The processor cache: an LRU bounded by bytes, like vLLM's multimodal processor cache.

An entry is the record of a processed image, not its pixels: the stand-in does the processing
work on a miss (``mmgate.sim.processor``) and then drops the float32 patches it never reads again,
keeping their size. Hits, misses and evictions follow the bytes vLLM would hold, while the
process holds ~100 bytes an entry instead of the patches (an embedded engine under a long
benchmark grew to gigabytes when it held them).

Plain class, no event loop: the engine calls it from the loop thread only.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ProcessedImage:
    """What the HF-processor stand-in produced for one image: its patch grid, the tokens it adds
    to the prompt, and ``num_bytes``, the size of its float32 patches (what vLLM's cache holds)."""

    grid_h: int
    grid_w: int
    num_tokens: int
    num_bytes: int


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
