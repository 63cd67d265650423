"""The media loader: the one entry point that turns an image URL into validated, encoded bytes.

    url ─► policy (pure) ─► key ─► local LRU ─► in-flight join ─► shared tier ─► origin
                                                                   (lease/wait)   (http(s), file:,
                                                                                   or data: bytes)
                                                   ◄── put local + shared ◄── validate + sha256
                                                                              (decode lanes)

Only validated bytes ever enter a tier, so a bad image never poisons a cache and a hit needs no
second decode. A ``data:`` URL is keyed by the SHA-256 of its decoded bytes, its digest too: a new
image is hashed once. One just seen costs no decode and no hash (``mmgate.media.repeats``: a fast
fingerprint, confirmed by comparing texts). Every ``MediaError`` raised carries the caller's ``param``.

Validation runs in two steps: a header probe (format, size: cheap, normal lane), then the full
decode in a worker process, in the lane the image's size picks, after the request's ``PixelBudget``
has been charged (``mmgate.media.decode``): one request's giant images neither hold up other
requests nor cost more than the per-request pixel limit, and a decode nobody waits for is killed.
A PNG is not decoded (its check is its chunks' CRCs, ``mmgate.media.validate``): check and hash
run in one call, on the loop for a screenshot (``_checked_inline``), else in the normal lane.
"""

from __future__ import annotations

import copy
import functools
import logging
import operator
from collections.abc import Awaitable, Callable
from typing import TypeVar

from prometheus_client import CollectorRegistry

from mmgate.config import CacheSettings, MediaSettings
from mmgate.errors import ForbiddenURLError, MediaError, OriginError
from mmgate.media.checks import (
    INLINE_HASH_BYTES,
    checked_inline,
    decoded_digest,
    hash_encode,
    probe_and_check,
)
from mmgate.media.dataurl import is_data_url, parse_data_url
from mmgate.media.decode import DecodeLanes, LoadTicket, PixelBudget
from mmgate.media.dns import Lookup
from mmgate.media.inflight import InflightMap
from mmgate.media.keys import data_url_key, scope_key, url_key
from mmgate.media.metrics import MediaMetrics, Outcome
from mmgate.media.origin import OriginFetcher
from mmgate.media.passthrough import check_passthrough_url
from mmgate.media.repeats import HeldImages, RepeatIndex, fingerprint, held_image
from mmgate.media.url_policy import UrlPolicy
from mmgate.store import ByteLRU, LoadedImage, SharedTier

log = logging.getLogger(__name__)

# data: URLs at least this long are parsed in the thread pool, not on the event loop (slicing
# out the payload is a copy); their payloads from ``INLINE_HASH_BYTES`` up are decoded there too.
_INLINE_PARSE_BYTES = 2 << 20
# Fingerprints of data: URLs the repeat index keeps (``mmgate.media.repeats``).
REPEAT_INDEX_ENTRIES = 65536

Produce = Callable[[], Awaitable[LoadedImage]]
_T = TypeVar("_T")


class MediaLoader:
    """Loads images for requests through the URL policy and the cache tiers (module docstring).

    ``shared`` is owned by the caller (the loader never closes it). ``lookup`` replaces DNS for
    origin fetches (tests only).
    """

    def __init__(
        self,
        media: MediaSettings,
        cache: CacheSettings,
        *,
        registry: CollectorRegistry | None = None,
        shared: SharedTier | None = None,
        lookup: Lookup | None = None,
    ) -> None:
        self._media = media
        self._cache = cache
        self._shared = shared
        self.policy = UrlPolicy(media)
        self._lookup = lookup
        self.metrics = MediaMetrics(registry if registry is not None else CollectorRegistry())
        self._fetcher = OriginFetcher(
            media, self.policy, on_bytes=self.metrics.origin_bytes.inc, lookup=lookup
        )
        self.local: ByteLRU[str, LoadedImage] = ByteLRU(
            cache.local_cache_bytes,
            operator.attrgetter("footprint_bytes"),
            max_entry_bytes=int(cache.local_cache_bytes * cache.local_max_entry_fraction),
            ttl_s=cache.cache_ttl_s,
            count_entries=True,
        )
        self._inflight: InflightMap[str, tuple[LoadedImage, Outcome]] = InflightMap()
        self._repeats = RepeatIndex(REPEAT_INDEX_ENTRIES, cache.cache_ttl_s)
        self._closed = False
        self._lanes = DecodeLanes(
            workers=media.decode_workers, large_image_pixels=media.large_image_pixels,
            max_queue_pixels=media.max_decode_queue_pixels,
            on_abandon=lambda reason: self.metrics.decodes_abandoned.labels(reason=reason).inc(),
        )
        lanes = self._lanes
        self.metrics.decode_queue_pixels.set_function(lambda: lanes.queued_large_pixels)  # read at scrape

    async def start(self) -> None:
        """Start the decode processes (bounded wait): the first image decodes without waiting for one."""
        await self._lanes.start()

    def pixel_budget(self, loads: int = 0) -> PixelBudget:
        """A fresh per-request budget of decoded pixels (``--max-request-pixels``), admitting the
        request's ``loads`` to the large decode lane together (each ``load`` call with it counts)."""
        return PixelBudget(self._media.max_request_pixels, self._lanes, loads)

    async def load(
        self, url: str, *, session_id: str | None = None, param: str | None = None,
        budget: PixelBudget | None = None, tenant_tag: str | None = None,
    ) -> LoadedImage:
        """The validated image ``url`` points at (http(s), ``data:`` or allowed ``file:``).

        Raises a ``MediaError`` subclass carrying ``param`` (the client's part path). ``budget``:
        the request's pixel budget, charged for the images this load decodes (not for cache hits).
        ``tenant_tag``: the tenant's tag (with API keys): its images live in its own key space in
        every tier, in-flight dedup included.
        """
        image, _ = await self.load_with_outcome(url, session_id=session_id, param=param, budget=budget,
                                                tenant_tag=tenant_tag)
        return image

    async def load_with_outcome(
        self, url: str, *, session_id: str | None = None, param: str | None = None,
        budget: PixelBudget | None = None, tenant_tag: str | None = None,
    ) -> tuple[LoadedImage, Outcome]:
        """``load``, and where the image came from: the outcome ``mmgate_image_loads_total``
        counts for this one load (a tier, an in-flight join or the origin)."""
        ticket = LoadTicket(budget) if budget is not None else None
        try:
            image, outcome = await self._load(url, session_id, ticket, tenant_tag)
        except MediaError as exc:
            self.metrics.load("error")
            raise _with_param(exc, param) from exc.__cause__
        finally:
            if ticket is not None:  # cached, joined, failed or cancelled: the others need not wait
                ticket.stand_aside()
        self.metrics.load(outcome)
        return image, outcome

    def held(self, url: str, *, session_id: str | None = None, tenant_tag: str | None = None) -> LoadedImage | None:
        """``load``'s answer for a data: URL the local tier holds (an agent's resent screenshot),
        found at once, counted as a local hit: no task, parse or hash; None: ``load`` it."""
        if self._closed or not isinstance(url, str) or not is_data_url(url):
            return None
        hit = held_image(self._repeats, self.local, self._scope(session_id, tenant_tag), url, fingerprint(url),
                         self._media.max_image_bytes)
        if hit is not None:
            self.metrics.load("local_hit")
        return hit

    def held_images(self, session_id: str | None, tenant_tag: str | None) -> HeldImages:
        """The images held in the request's tenant and session space, for its parse to find its
        repeats in (``mmgate.media.repeats``): one per request."""
        return HeldImages(self._repeats, self.local, self._scope(session_id, tenant_tag))

    def _scope(self, session_id: str | None, tenant_tag: str | None) -> Callable[[str], str | None]:
        """A key → its tier key in the request's tenant and session space (``scope_key``)."""
        return functools.partial(scope_key, session_scoping=self._cache.session_scoping, session_id=session_id,
                                 tenant_tag=tenant_tag)

    async def check_passthrough(self, url: str, *, param: str | None = None, kind: str = "media") -> str:
        """The checked URL to forward for an audio/video part (of type ``kind``) the backend
        fetches itself."""
        try:
            return await check_passthrough_url(
                self.policy, url, timeout_s=self._media.connect_timeout_s, lookup=self._lookup, kind=kind
            )
        except MediaError as exc:
            raise _with_param(exc, param) from exc.__cause__

    async def close(self) -> None:
        """Stop running fetches, close the HTTP session and the thread pool."""
        self._closed = True
        await self._inflight.close()
        await self._fetcher.close()
        self._lanes.shutdown()

    # -- the pipeline ----------------------------------------------------------------------

    async def _load(
        self, url: str, session_id: str | None, ticket: LoadTicket | None, tenant_tag: str | None = None
    ) -> tuple[LoadedImage, Outcome]:
        if self._closed:
            raise OriginError("the media loader is shutting down; retry the request")
        if not isinstance(url, str) or not url:
            raise ForbiddenURLError("the image URL is empty")
        if is_data_url(url):
            return await self._load_data_url(url, session_id, ticket, tenant_tag)
        is_file = url[:5].lower() == "file:"
        if not is_file:
            # Pure and cheap: runs before any tier, so a hit never bypasses the policy.
            self.policy.check_url(url)
        try:
            key = url_key(url)
        except ValueError as exc:
            raise ForbiddenURLError(f"malformed image URL: {exc}") from exc

        async def produce() -> LoadedImage:
            return await self._validated(await self._fetcher.fetch(url), ticket, tenant_tag)

        return await self._through_tiers(key, session_id, produce, ticket, tenant_tag)

    async def _load_data_url(
        self, url: str, session_id: str | None, ticket: LoadTicket | None, tenant_tag: str | None
    ) -> tuple[LoadedImage, Outcome]:
        mark = fingerprint(url)
        hit = held_image(self._repeats, self.local, self._scope(session_id, tenant_tag), url, mark,
                         self._media.max_image_bytes)
        if hit is not None:  # a repeat: the image held under its fingerprint forwards this very URL
            return hit, "local_hit"
        if len(url) >= _INLINE_PARSE_BYTES:
            parsed = await self._in_pool(functools.partial(parse_data_url, max_bytes=self._media.max_image_bytes), url)
        else:
            parsed = parse_data_url(url, max_bytes=self._media.max_image_bytes)
        if parsed.num_bytes >= INLINE_HASH_BYTES:
            data, digest = await self._in_pool(decoded_digest, parsed)
        else:
            data, digest = decoded_digest(parsed)
        key = data_url_key(digest)
        self._repeats.remember(mark, key)

        produce = functools.partial(self._validated, data, ticket, tenant_tag, digest, url)
        return await self._through_tiers(key, session_id, produce, ticket, tenant_tag)

    async def _through_tiers(
        self, key: str, session_id: str | None, produce: Produce, ticket: LoadTicket | None,
        tenant_tag: str | None,
    ) -> tuple[LoadedImage, Outcome]:
        tier_key = scope_key(
            key, session_scoping=self._cache.session_scoping, session_id=session_id, tenant_tag=tenant_tag
        )
        if tier_key is None:  # scoping on, no session: no tier may see or keep this image
            return await produce(), "origin"
        hit = self.local.get(tier_key)
        if hit is not None:
            return hit, "local_hit"
        if ticket is not None and tier_key in self._inflight:
            ticket.stand_aside()  # joins a load that admits itself: waiting on it could deadlock
        (image, outcome), joined = await self._inflight.run(
            tier_key, functools.partial(self._fill, tier_key, produce)
        )
        return image, "inflight_join" if joined else outcome

    async def _fill(self, key: str, produce: Produce) -> tuple[LoadedImage, Outcome]:
        """Shared tier, else the origin; then keep the image in the tiers. Runs once per key."""
        shared = self._shared
        if shared is None:
            image = await produce()
            self._put_local(key, image)
            return image, "origin"
        hit = await shared.get(key)
        if hit is None and not await shared.acquire_fill_lease(key):
            hit = await shared.wait_for_fill(key)  # None: lease expired or cache trouble → fetch
            holds_lease = False
        else:
            holds_lease = hit is None
        if hit is not None:
            self._put_local(key, hit)
            return hit, "shared_hit"
        try:
            image = await produce()
            self._put_local(key, image)
            await shared.put(key, image)  # with our lease: stores and drops it in one step
        finally:
            if holds_lease:
                # Every path (fetch failed, write failed or bypassed, cancelled): other processes'
                # waiters fall back now, not at lease expiry. A no-op once the put dropped it.
                await shared.release_fill_lease(key)
        return image, "origin"

    def _put_local(self, key: str, image: LoadedImage) -> None:
        self.local.put(key, image)
        self.metrics.local_cache_bytes.set(self.local.num_cached_bytes)
        self.metrics.local_cache_entries.set(len(self.local))

    async def _validated(
        self, data: bytes, ticket: LoadTicket | None, tenant_tag: str | None, digest: str | None = None,
        url: str | None = None,
    ) -> LoadedImage:
        """Probe ``data``, charge the request's budget and wait for its admission (all its images
        together), then validate it in a decode process (the tenant's turn, the lane its size
        picks) and hash it (``digest``: its SHA-256 when already known; ``url``: the data: URL it
        was decoded from, kept as the one to forward when it is that already)."""
        media = self._media
        try:
            probe = (data, media.allowed_formats, media.max_image_pixels, digest, url)
            probed, checked = probe_and_check(*probe) if checked_inline(data) else await self._in_pool(probe_and_check, *probe)
            pixels = probed.width * probed.height
            reserved = False
            if ticket is not None:
                ticket.budget.charge(pixels)
                if checked is None:  # a decode to come: admitted with the request's other decodes
                    reserved = await ticket.budget.admit(ticket, pixels)
        finally:
            if ticket is not None:
                ticket.stand_aside()  # failed before its admission, or needs none: a no-op once it asked
        if checked is not None:
            sha, data_url = checked
            return LoadedImage(data=data, mime=probed.mime, width=probed.width, height=probed.height,
                               digest=sha, _data_url=data_url)
        info = await self._lanes.decode(pixels, tenant_tag, data, media.allowed_formats, media.max_image_pixels,
                                        reserved=reserved)
        sha, data_url = await self._in_pool(hash_encode, data, info.mime, digest, url)
        return LoadedImage(data=data, mime=info.mime, width=info.width, height=info.height, digest=sha,
                           _data_url=data_url)

    async def _in_pool(self, fn: Callable[..., _T], *args: object) -> _T:
        """Small work (hashes, base64, header probes) in the normal lane."""
        return await self._lanes.run(0, fn, *args)


def _with_param(exc: MediaError, param: str | None) -> MediaError:
    """A copy of ``exc`` naming ``param``: joined loads share one exception object, and each
    caller's part path differs, so the shared one is never mutated."""
    new = copy.copy(exc)
    new.param = param
    return new
