"""The request pipeline of one gateway: parse → load images → rewrite for the backend → route → send.

``Gateway`` owns the long-lived parts (media loader, router, metrics) and is what the HTTP layer
(``mmgate.api.app``) calls. It knows nothing of aiohttp's server side.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from mmgate.api.parse import ChatRequest, ImageSlot, parse_chat_request
from mmgate.backends.base import Backend, BackendReply, is_cache_miss
from mmgate.backends.http import status_error
from mmgate.config import GatewaySettings
from mmgate.errors import InvalidRequestError, UnknownUUIDError
from mmgate.media.loader import MediaLoader
from mmgate.media.types import LoadedImage
from mmgate.metrics import GatewayMetrics
from mmgate.routing.router import Router

log = logging.getLogger(__name__)
_MISS_INDEX = re.compile(r"image at index (\d+)")


def cache_miss_slot(reply: BackendReply, slots: list[ImageSlot]) -> ImageSlot | None:
    """The slot a vLLM cache-miss answer is about, or None when the reply is something else."""
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
    index = int(found.group(1)) if found else -1
    for slot in slots:
        if slot.index == index:
            return slot
    cache_only = [s for s in slots if s.is_cache_only]
    return cache_only[0] if cache_only else None


@dataclass(slots=True)
class ChatOutcome:
    """A backend's successful reply plus what the gateway did to get it."""

    reply: BackendReply
    backend: Backend
    headers: dict[str, str] = field(default_factory=dict)


class Gateway:
    """One gateway: settings, media loader, router and metrics, shared by all requests."""

    def __init__(
        self, settings: GatewaySettings, *, loader: MediaLoader, router: Router, metrics: GatewayMetrics
    ) -> None:
        self.settings = settings
        self.loader = loader
        self.router = router
        self.metrics = metrics

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
        request = self.parse(raw)
        session_id = self.session_id(headers)
        backend = self.router.pick(request.model, session_id)
        images = await self._load_images(request.slots, session_id)
        body = self._rewrite(request, images, backend)
        reply = await backend.chat(body, stream=request.stream)
        if reply.status != 200:
            self.metrics.backend_requests.labels(backend.name, f"http_{reply.status}").inc()
            miss = cache_miss_slot(reply, request.slots)
            if miss is not None:
                raise UnknownUUIDError(
                    f"image uuid {miss.uuid!r} is not in the cache of backend {backend.name} and the "
                    "request carries no data for it: send the image again with its url and uuid",
                    param=miss.param,
                )
            raise status_error(backend.name, reply.status, reply.body or b"")
        self.metrics.backend_requests.labels(backend.name, "ok").inc()
        return ChatOutcome(reply=reply, backend=backend, headers={"x-mmgate-backend": backend.name})

    async def _load_images(self, slots: list[ImageSlot], session_id: str | None) -> dict[int, LoadedImage]:
        """Load every URL-backed slot concurrently; the first failure cancels the rest."""
        to_load = [s for s in slots if s.url is not None]
        if not to_load:
            return {}
        if len(to_load) == 1:
            slot = to_load[0]
            assert slot.url is not None
            return {slot.index: await self.loader.load(slot.url, session_id=session_id, param=slot.param)}
        async with asyncio.TaskGroup() as group:
            tasks = {
                s.index: group.create_task(self.loader.load(s.url, session_id=session_id, param=s.param))
                for s in to_load
                if s.url is not None
            }
        return {index: task.result() for index, task in tasks.items()}

    def _rewrite(self, request: ChatRequest, images: dict[int, LoadedImage], backend: Backend) -> bytes:
        """Rewrite image parts in place to the backend's contract and serialise the body."""
        with_uuid = backend.kind == "vllm"
        for slot in request.slots:
            image = images.get(slot.index)
            part = slot.part
            if image is None:
                if not with_uuid:
                    raise InvalidRequestError(
                        f"cache-only image reference {slot.uuid!r} cannot be sent to backend "
                        f"{backend.name} (kind openai has no uuid cache) and the gateway holds no bytes for it",
                        param=slot.param,
                    )
                part["image_url"] = None
                part["uuid"] = slot.uuid
                self.metrics.images_forwarded.labels("reference").inc()
                continue
            image_url: dict[str, Any] = {"url": image.data_url()}
            original = part.get("image_url")
            if isinstance(original, dict) and "detail" in original:
                image_url["detail"] = original["detail"]
            part["image_url"] = image_url
            if with_uuid:
                part["uuid"] = slot.uuid if slot.uuid is not None else "sha256:" + image.digest
            else:
                part.pop("uuid", None)
            self.metrics.images_forwarded.labels("data").inc()
        return orjson.dumps(request.body)

    async def close(self) -> None:
        await self.router.close()
        await self.loader.close()
