"""Send a planned request to one backend: strip what it already holds, heal its cache misses.

vLLM answers a cache-only reference it does not hold with a 400 naming the image
(``mmgate.wire.cache_miss_index``). ``ReuseSender.send`` then gives every byte-less slot its bytes
from the UUID store, forgets what it believed the backend held, and re-sends with data — the
client never sees the miss. Only a slot the store cannot fill either is the client's 400.
"""

from __future__ import annotations

import asyncio

import orjson

from mmgate.backends import CHAT_PATH, Backend, BackendReply, status_error
from mmgate.errors import UnknownUUIDError
from mmgate.jsonbody import dumps_body
from mmgate.metrics import GatewayMetrics
from mmgate.reuse.plan import ReuseCounts, SlotPlan, render
from mmgate.reuse.sent import SentTracker
from mmgate.reuse.store import UUIDStore
from mmgate.wire import CACHE_MISS_STATUS, cache_miss_index

# Heal rounds per request: each must fill the slot the backend named, so this only bounds a
# backend that keeps evicting what it was just sent.
MAX_HEALS = 3


def reply_cache_miss_index(reply: BackendReply) -> int | None:
    """The image index a vLLM cache-miss reply names (-1 if unnamed), or None for other replies."""
    if reply.status != CACHE_MISS_STATUS or not reply.body or b"Cache miss" not in reply.body:
        return None
    try:
        body = orjson.loads(reply.body)
    except orjson.JSONDecodeError:
        return None
    return cache_miss_index(reply.status, body)


async def resolve_from_store(store: UUIDStore, plans: list[SlotPlan], named: SlotPlan | None) -> None:
    """Give every byte-less slot its bytes from the UUID store.

    ``named`` is the slot a backend reported missing (None: every slot must resolve, as for
    ``openai`` backends). A slot that must resolve and cannot is the client's 400.
    """
    missing = [p for p in plans if p.image is None]
    if not missing:
        return
    found = await asyncio.gather(*(store.get(p.key) for p in missing))
    for plan, image in zip(missing, found, strict=True):
        plan.image = image
    must = [p for p in missing if p.image is None and (named is None or p is named)]
    if must:
        raise UnknownUUIDError(
            f"unknown image uuid {must[0].slot.uuid!r}: neither the backend nor the gateway holds it "
            "(expired, evicted or never sent): send the image again with its url and uuid",
            param=must[0].slot.param,
        )


class ReuseSender:
    """The gateway's reuse state — UUID store, what each backend was sent — and the send/heal loop."""

    def __init__(self, store: UUIDStore, sent: SentTracker, metrics: GatewayMetrics, *, auto: bool) -> None:
        self.store = store
        self.sent = sent
        self.metrics = metrics
        self.auto = auto

    async def send(
        self, backend: Backend, body: dict[str, object], plans: list[SlotPlan], *, stream: bool,
        path: str = CHAT_PATH,
    ) -> tuple[BackendReply, ReuseCounts]:
        """The backend's successful reply and what reuse did; a backend error raises its ``MmgateError``.
        ``path``: the backend endpoint that reads the body's messages (chat completions, embeddings,
        pooling)."""
        with_uuid = backend.kind == "vllm"
        if not with_uuid:
            await resolve_from_store(self.store, plans, None)
        known = {p.key for p in plans if self.auto and with_uuid and self.sent.was_sent(backend.name, p.key)}
        counts = render(plans, with_uuid=with_uuid, already_sent=known)
        healed = 0
        for _ in range(MAX_HEALS + 1):
            reply = await backend.chat(await dumps_body(body), stream=stream, path=path)
            if reply.status == 200:
                break
            self.metrics.backend_requests.labels(backend.name, f"http_{reply.status}").inc()
            index = reply_cache_miss_index(reply) if with_uuid else None
            if index is None or healed >= MAX_HEALS:
                raise status_error(backend.name, reply.status, reply.body or b"")
            named = next((p for p in plans if p.slot.index == index), None)
            await resolve_from_store(self.store, plans, named)
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
        return reply, counts

    def _count(self, counts: ReuseCounts) -> None:
        m = self.metrics
        if counts.sent:
            m.forwarded_data.inc(counts.sent)
        if counts.references:
            m.forwarded_reference.inc(counts.references)
        if counts.stripped:
            m.forwarded_stripped.inc(counts.stripped)
            m.reuse_bytes_not_sent.inc(counts.bytes_not_sent)
