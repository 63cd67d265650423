"""What a dataset describes: media entries, turns, sessions (plain data, no parsing).

A turn's ``images`` holds its media parts in the order they are sent: its images, then its videos
(each entry's ``kind``). A video goes as a ``video_url`` part; vLLM caches a processed video under
its ``uuid`` as it caches an image, so everything said of an image's uuid, cache-only reference and
``--uuid-and-strip`` holds for a video.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

MediaKind = Literal["image", "video"]


@dataclass(frozen=True, slots=True)
class ImageEntry:
    """One image or video of a turn. ``source`` None: a cache-only reference to ``uuid``.

    ``source`` is an absolute file path, an ``http(s)://`` URL or a ``data:`` URL.
    """

    source: str | None
    uuid: str | None
    kind: MediaKind = "image"

    @property
    def is_cache_only(self) -> bool:
        return self.source is None

    @property
    def is_local_file(self) -> bool:
        return self.source is not None and not self.source.startswith(("http://", "https://", "data:"))


@dataclass(frozen=True, slots=True)
class Turn:
    """One request of a session as the dataset describes it. ``images``: images, then videos."""

    texts: tuple[str, ...]
    images: tuple[ImageEntry, ...]
    role: str = "user"
    delay_ms: float | None = None
    timestamp_ms: float | None = None
    output_length: int | None = None
    extra: Mapping[str, Any] | None = None
    line: int = 0


@dataclass(frozen=True, slots=True)
class Session:
    """Turns sent in order, never overlapping. ``accumulate_history``: multi-turn conversation."""

    session_id: str
    turns: tuple[Turn, ...]
    accumulate_history: bool
    system_prompt: str | None = None

    @property
    def num_images(self) -> int:
        return sum(len(t.images) for t in self.turns)

    @property
    def has_videos(self) -> bool:
        return any(e.kind == "video" for t in self.turns for e in t.images)
