"""The ``--uuid-and-strip`` planner: which images of a request carry data (pure logic, no I/O).

Within one session — the rows of a ``single_turn`` session and a ``multi_turn`` conversation alike,
the whole accumulated history included — every image gets a uuid (the dataset's, else a content
hash of its bytes or URL). An image whose uuid was already sent *with data* in an earlier request
of the session, and accepted by the server, becomes a cache-only reference
``{"type": "image_url", "image_url": null, "uuid": K}``. Dataset-authored cache-only references
always pass through. The planner learns what the server holds only from requests that succeeded
(``commit``); after a cache miss it forgets everything (``forget``) so the next turn sends data again.

Within a single request a repeated image keeps its data: vLLM looks a request's references up in
its processor cache before that request's own images are stored, so a reference to an image sent
in the same request would miss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from mmgate.bench.turn import MediaKind


@dataclass(frozen=True, slots=True)
class TurnImage:
    """An image ready to plan: ``url`` is what would be sent (None: cache-only in the dataset).

    ``authored_uuid`` is the dataset's uuid; ``content_uuid`` the content hash used when there is
    none (None for cache-only entries).
    """

    url: str | None
    authored_uuid: str | None
    content_uuid: str | None
    kind: MediaKind = "image"

    @property
    def is_cache_only(self) -> bool:
        return self.url is None


@dataclass(frozen=True, slots=True)
class PlannedImage:
    """One image (or video) part of the request as it will be sent. ``url`` None: cache-only reference.

    ``content`` and ``size``: the part's content uuid and the length of the URL it has (or would
    have, when stripped); None and 0 for a dataset-authored cache-only reference. Accounting only:
    two plans are equal when they send the same parts.
    """

    url: str | None
    uuid: str | None
    stripped: bool = False
    kind: MediaKind = "image"
    content: str | None = field(default=None, compare=False)
    size: int = field(default=0, compare=False)

    @property
    def is_cache_only(self) -> bool:
        return self.url is None


@dataclass(frozen=True, slots=True)
class PlanCounts:
    """What a plan sends. A cache-only reference is still a logical image. Images and videos are
    counted apart; ``cache_only_refs`` and ``stripped_refs`` count both. ``videos``: (content uuid,
    URL length) of each video with a known content, for the run's unique video bytes."""

    logical_images: int
    images_with_data: int
    cache_only_refs: int
    stripped_refs: int
    image_bytes_sent: int
    logical_videos: int = 0
    videos_with_data: int = 0
    video_bytes_sent: int = 0
    videos: tuple[tuple[str, int], ...] = ()


class StripPlanner:
    """Per-session memory of the uuids the server has received with data.

    With ``enabled`` False the planner only passes the dataset through: images keep their data
    and their authored uuid (if any); nothing is stripped and nothing is remembered.
    """

    __slots__ = ("_enabled", "_sent")

    def __init__(self, enabled: bool) -> None:
        self._enabled = enabled
        self._sent: set[str] = set()

    @property
    def enabled(self) -> bool:
        return self._enabled

    @property
    def num_known_uuids(self) -> int:
        return len(self._sent)

    def plan(self, slots: Sequence[TurnImage]) -> list[PlannedImage]:
        """The image parts of the next request, in order."""
        out: list[PlannedImage] = []
        for slot in slots:
            if slot.url is None:
                out.append(PlannedImage(None, slot.authored_uuid, kind=slot.kind))
                continue
            size = len(slot.url)
            if not self._enabled:
                out.append(PlannedImage(slot.url, slot.authored_uuid, False, slot.kind, slot.content_uuid, size))
                continue
            uuid = slot.authored_uuid or slot.content_uuid
            if uuid is not None and uuid in self._sent:
                out.append(PlannedImage(None, uuid, True, slot.kind, slot.content_uuid, size))
            else:
                out.append(PlannedImage(slot.url, uuid, False, slot.kind, slot.content_uuid, size))
        return out

    def commit(self, plan: Sequence[PlannedImage]) -> None:
        """The request carrying ``plan`` succeeded: the server now holds its images with data."""
        if not self._enabled:
            return
        for image in plan:
            if image.url is not None and image.uuid is not None:
                self._sent.add(image.uuid)

    def forget(self) -> None:
        """The server missed a reference (eviction, restart, another replica): start over."""
        self._sent.clear()


def count_plan(plan: Sequence[PlannedImage]) -> PlanCounts:
    """Counts of a plan; ``*_bytes_sent`` is the length of the URLs (data: URLs included)."""
    with_data = [0, 0]  # images, videos
    nbytes = [0, 0]
    logical = [0, 0]
    stripped = 0
    videos = []
    for image in plan:
        k = image.kind == "video"
        logical[k] += 1
        if image.url is not None:
            with_data[k] += 1
            nbytes[k] += len(image.url)
        elif image.stripped:
            stripped += 1
        if k and image.content is not None:
            videos.append((image.content, image.size))
    return PlanCounts(logical[0], with_data[0], len(plan) - with_data[0] - with_data[1], stripped, nbytes[0],
                      logical[1], with_data[1], nbytes[1], tuple(videos))
