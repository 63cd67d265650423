"""Healing a backend's cache miss: recognise vLLM's cache-miss reply (a 400 naming the image,
``mmgate.vllm_protocol.cache_miss_index``) and give byte-less slots their bytes from the UUID store.
``mmgate.reuse.sender`` runs the send/heal loop."""

from __future__ import annotations

import asyncio

import orjson

from mmgate.backends import BackendReply
from mmgate.errors import UnknownUUIDError
from mmgate.reuse.plan import SlotPlan
from mmgate.reuse.store import UUIDStore
from mmgate.vllm_protocol import CACHE_MISS_STATUS, cache_miss_index

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
