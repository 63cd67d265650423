"""The request pipeline of one gateway: authenticate → parse → route → load images → plan reuse →
send → heal a backend cache miss → answer.

``Gateway`` owns the long-lived parts (media loader, router, UUID store, sent-uuid tracker, metrics)
and is what the HTTP layer (``mmgate.api.app``) calls. It knows nothing of aiohttp's server side.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import orjson

from mmgate.api.parse import ChatRequest, ImageSlot, parse_chat_request
from mmgate.backends.base import Backend, BackendReply, is_cache_miss
from mmgate.backends.http import status_error
from mmgate.config import GatewaySettings
from mmgate.errors import BackendConnectError, BackendTimeoutError, UnknownUUIDError
from mmgate.media.loader import MediaLoader
from mmgate.media.types import LoadedImage
from mmgate.metrics import GatewayMetrics
from mmgate.reuse.namespace import backend_uuid, content_uuid
from mmgate.reuse.plan import ReuseCounts, SlotPlan, render
from mmgate.reuse.sent import SentTracker
from mmgate.reuse.store import UUIDStore
from mmgate.reuse.tenants import TenantKeys
from mmgate.routing.router import Router

log = logging.getLogger(__name__)
_MISS_INDEX = re.compile(r"image at index (\d+)")
# Heal rounds per request: each must fill the slot the backend named, so this only bounds a
# backend that keeps evicting what it was just sent.
MAX_HEALS = 3


def cache_miss_index(reply: BackendReply) -> int | None:
    """The image index a vLLM cache-miss answer names (-1 if unnamed), or None for other replies."""
    if reply.status != 400 or not reply.body or b"Cache miss" not in reply.body:
        return None
    try:
        body = orjson.loads(reply.body)
    except orjson.JSONDecodeError:
        return None
    if not is_cache_miss(reply.status, body):
        return None
    err = body.get("error") if isinstance(body.get("error"), dict) else body
    found = _MISS_INDEX.search(str(err.get("message", "")))
    return int(found.group(1)) if found else -1


@dataclass(slots=True)
class ChatOutcome:
    """A backend's successful reply plus what the gateway did to get it."""

    reply: BackendReply
    backend: Backend
    headers: dict[str, str] = field(default_factory=dict)
    on_finish: Callable[[], None] | None = None

    def finish(self) -> None:
        """The reply was delivered (or abandoned): the backend's request is over (idempotent)."""
        if self.on_finish is not None:
            done, self.on_finish = self.on_finish, None
            done()


class Gateway:
    """One gateway: settings, media loader, router, UUID store and metrics, shared by all requests."""

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        loader: MediaLoader,
        router: Router,
        metrics: GatewayMetrics,
        store: UUIDStore,
        tenants: TenantKeys | None = None,
    ) -> None:
        self.settings = settings
        self.loader = loader
        self.router = router
        self.metrics = metrics
        self.store = store
        self.tenants = tenants
        self.reuse_auto = settings.reuse == "auto"
        self.sent = SentTracker(int(settings.reuse_backend_cache_gb * 1024**3))

    def session_id(self, headers: Mapping[str, str]) -> str | None:
        """The first present session header of the configured list."""
        for name in self.settings.session_headers:
            value = headers.get(name)
            if value:
                return value
        return None

    def parse(self, raw: bytes) -> ChatRequest:
        return parse_chat_request(
            raw,
            max_images=self.settings.max_images_per_request,
            max_uuid_length=self.settings.max_uuid_length,
        )

    async def chat(self, raw: bytes, headers: Mapping[str, str]) -> ChatOutcome:
        """Run one chat request to a successful backend reply, or raise an ``MmgateError``."""
        tenant = self.tenants.tenant_for(headers.get("Authorization")) if self.tenants is not None else None
        request = self.parse(raw)
        session_id = self.session_id(headers)
        # The router's order of preference: the first is its pick, the second the failover.
        ranked = self.router.ranked(request.model, session_id)
        images = self._known_by_uuid(request.slots, tenant)
        images.update(await self._load_images([s for s in request.slots if s.index not in images], session_id))
        plans = self._plan(request.slots, images, tenant)
        try:
            return await self._tracked_send(request, plans, ranked[0])
        except BackendConnectError:
            # Nothing reached that backend (whether or not it is ejected yet): try the next one once.
            if len(ranked) < 2:
                raise
            return await self._tracked_send(request, plans, ranked[1])

    async def _tracked_send(self, request: ChatRequest, plans: list[SlotPlan], backend: Backend) -> ChatOutcome:
        """``_send`` with the router's outstanding-request count and passive health reports."""
        router = self.router
        router.begin(backend)
        try:
            outcome = await self._send(request, plans, backend)
        except (BackendConnectError, BackendTimeoutError):
            router.end(backend)
            router.report_failure(backend)
            raise
        except BaseException:
            router.end(backend)
            raise
        router.report_success(backend)
        outcome.on_finish = lambda: router.end(backend)
        return outcome

    def _known_by_uuid(self, slots: list[ImageSlot], tenant: str | None) -> dict[int, LoadedImage]:
        """Images the client labelled with a uuid the gateway already holds: not loaded again.

        vLLM's own contract: a uuid identifies its image, so a repeat of (uuid, url) needs no
        download, decode or hash — the bytes validated when the uuid was first seen are used. Off
        with session scoping, whose promise is that nothing crosses sessions.
        """
        if self.settings.cache.session_scoping:
            return {}
        known = {}
        for slot in slots:
            if slot.uuid is not None and slot.url is not None:
                image = self.store.peek(backend_uuid(tenant, slot.uuid))
                if image is not None:
                    known[slot.index] = image
        return known

    def _plan(
        self, slots: list[ImageSlot], images: dict[int, LoadedImage], tenant: str | None
    ) -> list[SlotPlan]:
        plans = []
        for slot in slots:
            image = images.get(slot.index)
            if slot.uuid is not None:
                key = backend_uuid(tenant, slot.uuid)
                if image is not None:
                    self.store.put(key, image)
            elif image is not None:
                key = content_uuid(tenant, image.digest)
            else:  # the parser guarantees a url or a uuid
                raise AssertionError("slot without url or uuid")
            plans.append(SlotPlan(slot=slot, key=key, image=image, from_client=image is not None))
        return plans

    async def _send(self, request: ChatRequest, plans: list[SlotPlan], backend: Backend) -> ChatOutcome:
        with_uuid = backend.kind == "vllm"
        if not with_uuid:
            await self._resolve_from_store(plans, None)
        known = {p.key for p in plans if self.reuse_auto and with_uuid and self.sent.was_sent(backend.name, p.key)}
        counts = render(plans, with_uuid=with_uuid, already_sent=known)
        healed = 0
        for _ in range(MAX_HEALS + 1):
            reply = await backend.chat(orjson.dumps(request.body), stream=request.stream)
            if reply.status == 200:
                break
            self.metrics.backend_requests.labels(backend.name, f"http_{reply.status}").inc()
            index = cache_miss_index(reply) if with_uuid else None
            if index is None or healed >= MAX_HEALS:
                raise status_error(backend.name, reply.status, reply.body or b"")
            named = next((p for p in plans if p.slot.index == index), None)
            await self._resolve_from_store(plans, named)
            for p in plans:
                self.sent.forget(backend.name, p.key)
            healed += 1
            self.metrics.reuse_heals.inc()
            counts = render(plans, with_uuid=with_uuid, already_sent=set(), force_data=True)
        self.metrics.backend_ok(backend.name)
        counts.healed = healed
        if with_uuid:
            for p in plans:
                if p.sent_data and p.image is not None:
                    self.sent.mark_sent(backend.name, p.key, p.image.width, p.image.height)
        self._count(counts)
        headers = {"x-mmgate-backend": backend.name, "x-mmgate-reuse": counts.header()}
        return ChatOutcome(reply=reply, backend=backend, headers=headers)

    async def _resolve_from_store(self, plans: list[SlotPlan], named: SlotPlan | None) -> None:
        """Give every byte-less slot its bytes from the UUID store.

        ``named`` is the slot a backend reported missing (None: every slot must resolve, as for
        ``openai`` backends). A slot that must resolve and cannot is the client's 400.
        """
        missing = [p for p in plans if p.image is None]
        if not missing:
            return
        found = await asyncio.gather(*(self.store.get(p.key) for p in missing))
        for plan, image in zip(missing, found, strict=True):
            plan.image = image
        must = [p for p in missing if p.image is None and (named is None or p is named)]
        if must:
            raise UnknownUUIDError(
                f"unknown image uuid {must[0].slot.uuid!r}: neither the backend nor the gateway holds it "
                "(expired, evicted or never sent): send the image again with its url and uuid",
                param=must[0].slot.param,
            )

    def _count(self, counts: ReuseCounts) -> None:
        m = self.metrics
        if counts.sent:
            m.forwarded_data.inc(counts.sent)
        if counts.references:
            m.forwarded_reference.inc(counts.references)
        if counts.stripped:
            m.forwarded_stripped.inc(counts.stripped)
            m.reuse_bytes_not_sent.inc(counts.bytes_not_sent)

    async def _load_images(self, slots: list[ImageSlot], session_id: str | None) -> dict[int, LoadedImage]:
        """Load every URL-backed slot concurrently; the first failure cancels the rest."""
        to_load = [(s, s.url) for s in slots if s.url is not None]
        if not to_load:
            return {}
        if len(to_load) == 1:
            slot, url = to_load[0]
            return {slot.index: await self.loader.load(url, session_id=session_id, param=slot.param)}
        tasks = [
            asyncio.create_task(self.loader.load(url, session_id=session_id, param=slot.param))
            for slot, url in to_load
        ]
        try:
            loaded = await asyncio.gather(*tasks)
        except BaseException:
            # The first failure is the answer; the other loads are abandoned (their fetches are
            # shared through in-flight dedup and finish for any other waiter).
            for task in tasks:
                task.cancel()
            raise
        return {slot.index: image for (slot, _), image in zip(to_load, loaded, strict=True)}

    async def close(self) -> None:
        await self.router.close()
        await self.store.close()
        await self.loader.close()
