"""Send a planned request to one backend: strip what it holds, heal its cache misses.

What the backend holds is the router's record (``mmgate.routing.BackendHoldings``), so the sender
strips exactly what the router believed it was sending to a holder. vLLM answers a cache-only
reference it does not hold with a 400 naming the image (``mmgate.vllm_protocol.cache_miss_index``);
``ReuseSender.send`` then forgets the request's images on that backend, gives every byte-less
slot its bytes from the UUID store and re-sends with data: the client never sees the miss. Only a
slot the store cannot fill either is the client's 400. Once the backend answered 200 it holds
every image of the request.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from mmgate.backends import CHAT_PATH, Backend, BackendReply, status_error
from mmgate.errors import CacheShareError
from mmgate.fleet import BackendHoldings, processed_bytes
from mmgate.jsonbody import LARGE_BODY_BYTES, dumps_body
from mmgate.metrics import GatewayMetrics
from mmgate.reuse.cache_share import CacheShares
from mmgate.reuse.heal import MAX_HEALS, reply_cache_miss_index, resolve_from_store
from mmgate.reuse.namespace import tag_of
from mmgate.reuse.plan import ReuseCounts, SlotPlan, render
from mmgate.reuse.store import UUIDStore
from mmgate.routing import image_weight

# A client body below this, with no image inlined, is sent without looking for big strings.
SMALL_BODY_BYTES = LARGE_BODY_BYTES // 2


def reply_headers(backend: str, counts: ReuseCounts) -> dict[str, str]:
    """The gateway's headers on a backend's successful reply: who answered, what reuse did."""
    return {"x-mmgate-backend": backend, "x-mmgate-reuse": counts.header()}


def held_size(plan: SlotPlan, store: UUIDStore | None = None) -> int:
    """The processed size a backend keeps of the slot's image: a reference's from the uuid store's
    local copy when ``store`` has it, a default when its size is unknown."""
    image = plan.image if plan.image is not None or store is None else store.peek(plan.key)
    tokens = image_weight(image.width, image.height, None) if image is not None else image_weight(None, None, None)
    return processed_bytes(tokens)


class ReuseSender:
    """The gateway's reuse state — UUID store, what each backend holds — and the send/heal loop."""

    def __init__(self, store: UUIDStore, holdings: BackendHoldings, metrics: GatewayMetrics, *, auto: bool,
                 tenants_on: Callable[[], bool] = lambda: False) -> None:
        self.store = store
        self.holdings = holdings
        self.metrics = metrics
        self.auto = auto
        # True while API keys are configured: every key then leads with its tenant's tag, made by
        # the gateway (without keys a client's uuid could spell one).
        self.tenants_on = tenants_on
        # Each tenant's share of each backend's cache, judged on the holdings.
        self.shares = CacheShares(holdings)

    async def send(
        self, backend: Backend, body: dict[str, object], plans: list[SlotPlan], *, stream: bool,
        path: str = CHAT_PATH, body_bytes: int | None = None,
    ) -> tuple[BackendReply, ReuseCounts]:
        """The backend's successful reply and what reuse did; a backend error raises its ``MmgateError``.
        ``path``: the backend endpoint that reads the body's messages (chat completions, embeddings,
        pooling). ``body_bytes``: the size of the client's JSON ``body`` was parsed from, if it was."""
        with_uuid = backend.kind == "vllm"
        if plans and not with_uuid:
            await resolve_from_store(self.store, plans, None)
        known = {p.key for p in plans if self.auto and with_uuid and self.holdings.holds(backend.name, p.key)}
        counts = render(plans, with_uuid=with_uuid, already_sent=known)
        # Keys carry their tenant's tag (none without tenants: then there is no share to keep).
        tag = tag_of(plans[0].key) if plans and with_uuid and self.tenants_on() else ""
        reserved = 0
        if tag:
            try:
                # An image larger than the whole cache is not kept there: it evicts nothing.
                sizes = (held_size(p) for p in plans if p.sent_data)
                reserved = self.shares.admit(backend.name, tag,
                                             sum(n for n in sizes if n <= self.holdings.budget_bytes))
            except CacheShareError:
                self.metrics.cache_share_refusals.inc()
                raise
        try:
            return await self._send(backend, body, plans, counts, with_uuid=with_uuid, stream=stream, path=path,
                                    body_bytes=body_bytes)
        finally:
            if tag:
                self.shares.release(backend.name, tag, reserved)
                self.shares.changed(backend.name)

    async def _send(
        self, backend: Backend, body: dict[str, object], plans: list[SlotPlan], counts: ReuseCounts, *,
        with_uuid: bool, stream: bool, path: str, body_bytes: int | None,
    ) -> tuple[BackendReply, ReuseCounts]:
        """``send`` once the request is rendered and admitted: the send/heal loop."""
        for healed in range(MAX_HEALS + 1):
            # No image inlined into a small client body: what is sent is about as small (a hint
            # that spares dumps_body's walk for big strings; the output is the same either way).
            small = body_bytes is not None and body_bytes < SMALL_BODY_BYTES and not any(p.sent_data for p in plans)
            counts.healed = healed  # the heals before this send
            sent = orjson.dumps(body) if small else await dumps_body(body)  # small: no walk, no coroutine
            reply = await backend.chat(sent, stream=stream, path=path)
            if reply.status == 200:
                break
            self.metrics.backend_requests.labels(backend.name, f"http_{reply.status}").inc()
            index = reply_cache_miss_index(reply) if with_uuid else None
            if index is None or healed >= MAX_HEALS:
                raise status_error(backend.name, reply.status, reply.body or b"")
            self.holdings.forget(backend.name, [p.key for p in plans])
            named = next((p for p in plans if p.slot.index == index), None)
            await resolve_from_store(self.store, plans, named)
            self.metrics.reuse_heals.inc()
            counts = render(plans, with_uuid=with_uuid, already_sent=set(), force_data=True)
        self.metrics.backend_ok(backend.name)
        if plans:
            self.holdings.hold(backend.name, [(p.key, held_size(p, self.store)) for p in plans])
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
