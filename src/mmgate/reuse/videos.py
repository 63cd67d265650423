"""Video and audio reuse: a ``video_url``, ``audio_url`` or ``input_audio`` part's uuid namespaced
like an image's, repeats and uuid-only references sent to vLLM as references, and a backend's miss
healed with the media again.

vLLM 0.32 keeps a processed video or audio in its processor cache under the part's ``uuid`` and
serves a later ``{"type": "video_url", "video_url": null, "uuid": K}`` (``audio_url`` and
``input_audio`` alike) from it (``MultiModalContentParser.parse_video`` / ``parse_audio``:
``tracker.add(modality, (None, uuid))``); a reference it does not hold is its 400 "Cache miss for
video at index N but data is not provided." ("… for audio …").

The gateway does not load these (the backend fetches the URL the gateway checked), so what it keeps
per backend key is that checked URL (``VideoURLs``), not bytes; an ``input_audio``'s data is kept as
the ``data:audio/<format>;base64,`` URL vLLM reads it as (``mmgate.media.audio``):

* a ``data:`` video or audio sent without a uuid is keyed by its content (``KeySpace.content_uuid``
  of its SHA-256, taken by the container check, ``mmgate.media.video`` / ``mmgate.media.audio``), as
  an image is; an audio's content key is apart from a video's of the same bytes (an MP4 is both);
* a part with a URL and a key goes with the URL the first time; a repeat (same key, same URL) to a
  backend the router's record says holds the key goes as a reference (a *strip*, ``--reuse auto``);
* a uuid-only reference goes as a reference;
* the router weighs a video or audio key as it weighs an image's (affinity to the backend that holds it);
* on vLLM's video or audio cache miss every reference is re-sent with the URL last checked for its
  key, or, when the gateway never saw one, the client gets a 400 naming the part (``UnknownUUIDError``).

Keys are ``KeySpace.backend_uuid``'s, so a tenant can only ever name its own media. With a shared
tier (Redis) each key's checked URL is also written there, in the background, as an image's bytes
are (``mmgate.reuse.store``): a gateway that never saw the media — another in the fleet, or this one
after a restart — heals vLLM's miss of a uuid-only reference with it. Otherwise pure logic.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from mmgate.errors import BackendStatusError, UnknownUUIDError
from mmgate.fleet import BackendHoldings
from mmgate.media.audio import AUDIO_KINDS, media_url, media_value
from mmgate.reuse.namespace import KeySpace
from mmgate.routing import image_weight
from mmgate.store import LoadedImage, SharedTier
from mmgate.vllm_protocol import CACHE_MISS_MARKER, CACHE_MISS_STATUS, error_message

Reply = TypeVar("Reply")

# What a backend's processor cache is assumed to spend on one video, for the router's record of what
# each backend holds (its eviction order): the gateway never sees a video's frames.
VIDEO_HELD_BYTES = 8 << 20
# A video's weight for the router (its load and affinity), in image tokens: what the gateway cannot
# count (it never sees the frames), taken as eight images' worth.
VIDEO_WEIGHT = 8 * image_weight(None, None, None)
# An audio's, held and weighed: Whisper-style features of a 30 s window (128 x 3000 float32, 1.5
# MiB) and up to 750 audio tokens, about one image's worth.
AUDIO_HELD_BYTES = 2 << 20
AUDIO_WEIGHT = image_weight(None, None, None)
# Characters of checked URLs (``data:`` URLs included: the memory they hold) the gateway keeps to
# strip repeats and heal misses; past it the least recently used go (their repeats are sent whole,
# a reference the backend misses then is the client's 400).
VIDEO_URL_CHARS = 64 << 20
# A video or audio key's URL in the shared tier: its own key space, and a MIME type no image has.
SHARED_PREFIX = "video-url:"
URL_MIME = "text/uri-list"


class VideoPart(Protocol):
    """A parsed video or audio part (``mmgate.api.chat_request.PassthroughSlot``)."""

    param: str
    kind: str
    uuid: str | None
    part: dict[str, Any]

    @property
    def url(self) -> str | None: ...

    @property
    def digest(self) -> str | None: ...


@dataclass(slots=True)
class VideoRef:
    """A video or audio part with a uuid: its backend key and the checked URL the client sent now
    (None: a uuid-only reference)."""

    param: str
    kind: str
    part: dict[str, Any]
    key: str
    uuid: str
    url: str | None
    repeat: bool = False  # the key was last sent with this very URL

    @property
    def medium(self) -> str:
        """vLLM's modality of the part: ``audio`` or ``video``."""
        return "audio" if self.kind in AUDIO_KINDS else "video"

    @property
    def held_bytes(self) -> int:
        """What a backend's processor cache is assumed to spend on it (the router's record)."""
        return AUDIO_HELD_BYTES if self.kind in AUDIO_KINDS else VIDEO_HELD_BYTES

    @property
    def weight(self) -> float:
        """Its weight for the router, in image tokens."""
        return AUDIO_WEIGHT if self.kind in AUDIO_KINDS else VIDEO_WEIGHT


class VideoURLs:
    """Backend key → the checked URL last sent with it; least recently used out first, past
    ``max_chars`` characters of URLs. With ``shared``, a new URL for a key is also written there
    (in the background, at most ``max_pending_writes`` at once: past that it is skipped, fail-open)
    and ``recall`` reads a key this process does not hold from it."""

    def __init__(self, max_chars: int = VIDEO_URL_CHARS, shared: SharedTier | None = None, *,
                 max_pending_writes: int = 64) -> None:
        self._urls: OrderedDict[str, str] = OrderedDict()
        self._chars = 0
        self.max_chars = max_chars
        self._shared = shared
        self._pending: set[asyncio.Task[None]] = set()
        self._max_pending = max_pending_writes

    def remember(self, key: str, url: str) -> None:
        if len(url) > self.max_chars:
            return
        if self._shared is not None and self._urls.get(key) != url and len(self._pending) < self._max_pending:
            entry = LoadedImage(url.encode(), URL_MIME, 0, 0, hashlib.sha256(url.encode()).hexdigest())
            task = asyncio.get_running_loop().create_task(self._shared.put(SHARED_PREFIX + key, entry))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
        self._keep(key, url)

    def _keep(self, key: str, url: str) -> None:
        old = self._urls.pop(key, None)
        if old is not None:
            self._chars -= len(old)
        self._urls[key] = url
        self._chars += len(url)
        while self._chars > self.max_chars:
            _, evicted = self._urls.popitem(last=False)
            self._chars -= len(evicted)

    def get(self, key: str) -> str | None:
        url = self._urls.get(key)
        if url is not None:
            self._urls.move_to_end(key)
        return url

    async def recall(self, key: str) -> str | None:
        """``get``, else the URL another gateway (or this one before a restart) wrote to the shared tier."""
        url = self.get(key)
        if url is not None or self._shared is None:
            return url
        entry = await self._shared.get(SHARED_PREFIX + key)
        if entry is None or entry.mime != URL_MIME or len(entry.data) > self.max_chars:
            return None
        url = entry.data.decode("utf-8", "replace")
        self._keep(key, url)
        return url

    async def close(self) -> None:
        """Let pending shared writes finish (each bounded by the tier's own timeouts)."""
        if self._pending:
            with contextlib.suppress(Exception):
                await asyncio.gather(*self._pending, return_exceptions=True)

    def __len__(self) -> int:
        return len(self._urls)


def video_refs(parts: Iterable[VideoPart], keys: KeySpace, tenant: str | None, urls: VideoURLs) -> list[VideoRef]:
    """The parts with a uuid — or, for a checked ``data:`` video or audio sent without one, its
    content key — their keys set on the parts (``uuid``: the backend key), the URL each one sent now
    remembered for its key (call once their URLs are checked)."""
    refs = []
    for p in parts:
        if p.uuid is not None:
            key, label = keys.backend_uuid(tenant, p.uuid), p.uuid
        elif p.digest is not None:
            digest = "audio-" + p.digest if p.kind in AUDIO_KINDS else p.digest
            key, label = keys.content_uuid(tenant, digest), "(content)"
        else:
            continue
        url = media_url(p.kind, p.part[p.kind]) if p.url is not None else None
        p.part["uuid"] = key
        repeat = url is not None and urls.get(key) == url
        if url is not None:
            urls.remember(key, url)
        refs.append(VideoRef(p.param, p.kind, p.part, key, label, url, repeat))
    return refs


def render_videos(refs: list[VideoRef], urls: VideoURLs, holds: Callable[[str], bool], *, strip: bool,
                  force_data: bool = False, with_uuid: bool = True) -> int:
    """Set each part's media (``video_url``, ``audio_url``, ``input_audio``) for one send; returns
    how many repeats went as references.

    A client reference goes as a reference, or with its remembered URL under ``force_data`` (a heal;
    ``UnknownUUIDError`` naming it when the gateway has none). A part with a URL goes as a reference
    when ``strip`` and the backend ``holds`` its key, sent with this very URL; else with its URL.
    ``with_uuid``: the part carries its key (a backend that reads none gets none)."""
    stripped = 0
    for ref in refs:
        if with_uuid:
            ref.part["uuid"] = ref.key
        else:
            ref.part.pop("uuid", None)
        if ref.url is None:
            url = urls.get(ref.key) if force_data else None
            if force_data and url is None:
                raise UnknownUUIDError(
                    f"unknown {ref.medium} uuid {ref.uuid!r}: neither the backend nor the gateway holds it (expired, "
                    f"evicted or never sent): send the {ref.medium} again with its {ref.kind} and uuid",
                    param=ref.param)
            ref.part[ref.kind] = media_value(ref.kind, url) if url is not None else None
        elif strip and not force_data and ref.repeat and holds(ref.key):
            ref.part[ref.kind] = None
            stripped += 1
        else:
            ref.part[ref.kind] = media_value(ref.kind, ref.url)
    return stripped


def is_video_cache_miss(exc: BackendStatusError, media: Iterable[str] = ("video",)) -> bool:
    """True for vLLM's answer to a reference it does not hold, of one of the ``media`` (its
    modalities: ``video``, ``audio``)."""
    body = exc.body if isinstance(exc.body, dict) else None
    if exc.backend_status != CACHE_MISS_STATUS or body is None:
        return False
    message = error_message(body, "")
    return CACHE_MISS_MARKER in message and any(f"Cache miss for {m} " in message for m in media)


async def send_healing_videos(
    send: Callable[[], Awaitable[Reply]], refs: list[VideoRef], urls: VideoURLs, holdings: BackendHoldings,
    backend: str, *, with_uuid: bool, strip: bool, on_heal: Callable[[], None],
) -> Reply:
    """``send`` with the video and audio parts rendered for ``backend`` (``with_uuid``: a vLLM
    backend, which reads references; any other gets every URL); vLLM's cache miss of one healed once
    with the URLs."""
    if not with_uuid:
        for ref in refs:
            if ref.url is None:
                await urls.recall(ref.key)
    render_videos(refs, urls, lambda key: holdings.holds(backend, key), strip=strip and with_uuid,
                  force_data=not with_uuid, with_uuid=with_uuid)
    try:
        return await send()
    except BackendStatusError as exc:
        if not refs or not is_video_cache_miss(exc, {ref.medium for ref in refs}):
            raise
    holdings.forget(backend, [v.key for v in refs])
    for ref in refs:
        if ref.url is None:
            await urls.recall(ref.key)  # a reference this gateway never saw the video of: the shared tier's
    render_videos(refs, urls, lambda key: False, strip=False, force_data=True)
    on_heal()
    return await send()
