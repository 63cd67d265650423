"""Per-request reuse plan: which image goes to the backend as data, which as a cache-only reference.

``plan_slots`` gives each parsed slot its backend uuid and bytes, and records client-labelled
images in the UUID store; ``render`` then rewrites the body for one backend (pure, no I/O).
Rules for a ``vllm`` backend:

* an image the client sent (URL or data) goes with its bytes and its backend uuid ``K`` — unless
  reuse is ``auto`` and this backend was already sent ``K`` with data: then a cache-only reference
  (a *strip*);
* a client cache-only reference goes as ``image_url: null`` + ``K``;
* ``force_data`` (healing) sends every slot that has bytes with its bytes.

An ``openai`` backend never sees a uuid: every slot must have bytes by the time it is rendered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mmgate.reuse.namespace import KeySpace
from mmgate.reuse.store import UUIDStore
from mmgate.routing import RoutedImage, image_weight
from mmgate.store import LoadedImage


@dataclass(slots=True)
class ImageSlot:
    """One image part of a request: a URL to load, a uuid, or both.

    ``index`` counts the request's images in order (vLLM's "image at index N"); ``param`` is the
    part's path for error bodies (``messages[2].content[1]``). ``part`` is the client's own dict,
    rewritten in place for the backend.
    """

    index: int
    param: str
    part: dict[str, Any]
    url: str | None
    uuid: str | None


@dataclass(slots=True)
class SlotPlan:
    """One image slot: its backend uuid and, when known, its bytes."""

    slot: ImageSlot
    key: str
    image: LoadedImage | None
    from_client: bool  # the client sent the bytes in this request (not resolved from the store)
    sent_data: bool = False


@dataclass(slots=True)
class ReuseCounts:
    """What one request did: images sent with data, stripped to references, healed."""

    sent: int = 0
    stripped: int = 0
    references: int = 0
    healed: int = 0
    bytes_not_sent: int = 0

    def header(self) -> str:
        return f"sent={self.sent}; stripped={self.stripped}; referenced={self.references}; healed={self.healed}"


def known_by_uuid(
    store: UUIDStore, slots: list[ImageSlot], keys: KeySpace, tenant: str | None
) -> dict[int, LoadedImage]:
    """Images the client labelled with a uuid the gateway already holds: not loaded again.

    vLLM's own contract: a uuid identifies its image, so a repeat of (uuid, url) needs no
    download, decode or hash — the bytes validated when the uuid was first seen are used. The
    caller skips this with session scoping, whose promise is that nothing crosses sessions.
    """
    known = {}
    for slot in slots:
        if slot.uuid is not None and slot.url is not None:
            image = store.peek(keys.backend_uuid(tenant, slot.uuid))
            if image is not None:
                known[slot.index] = image
    return known


def plan_slots(
    store: UUIDStore, slots: list[ImageSlot], images: dict[int, LoadedImage], keys: KeySpace, tenant: str | None
) -> list[SlotPlan]:
    """Each slot's plan: its backend uuid and loaded bytes. A client uuid that came with its image
    is remembered in the UUID store (for healing and for ``openai`` backends)."""
    plans = []
    for slot in slots:
        image = images.get(slot.index)
        if slot.uuid is not None:
            key = keys.backend_uuid(tenant, slot.uuid)
            if image is not None:
                store.put(key, image)
        elif image is not None:
            key = keys.content_uuid(tenant, image.digest)
        else:  # the parser guarantees a url or a uuid
            raise AssertionError("slot without url or uuid")
        plans.append(SlotPlan(slot=slot, key=key, image=image, from_client=image is not None))
    return plans


def render(
    plans: list[SlotPlan],
    *,
    with_uuid: bool,
    already_sent: set[str],
    force_data: bool = False,
) -> ReuseCounts:
    """Rewrite each slot's part in place for the backend; return the counts.

    ``already_sent`` holds the keys this backend is believed to hold (empty when reuse is off).
    """
    counts = ReuseCounts()
    for plan in plans:
        part = plan.slot.part
        image = plan.image
        strip = (
            with_uuid and image is not None and not force_data and plan.from_client and plan.key in already_sent
        )
        if image is None or strip:
            part["image_url"] = None
            part["uuid"] = plan.key
            plan.sent_data = False
            if strip and image is not None:
                counts.stripped += 1
                counts.bytes_not_sent += image.num_bytes
            else:
                counts.references += 1
            continue
        if part.get("type") == "input_image":
            # The Responses API's part: its image_url is the URL string, its detail a sibling key.
            part["image_url"] = image.data_url()
        else:
            part["image_url"] = _chat_image_url(part, image)
        if with_uuid:
            part["uuid"] = plan.key
        else:
            part.pop("uuid", None)
        plan.sent_data = True
        counts.sent += 1
    return counts


def _chat_image_url(part: dict[str, Any], image: LoadedImage) -> dict[str, Any]:
    """A chat ``image_url`` object carrying ``image``'s data URL and the part's ``detail``."""
    image_url: dict[str, Any] = {"url": image.data_url()}
    original = part.get("image_url")
    if isinstance(original, dict) and "detail" in original:
        image_url["detail"] = original["detail"]
    return image_url


def routed_images(store: UUIDStore, plans: list[SlotPlan]) -> list[RoutedImage]:
    """Each slot's backend key and weight, for the router: its image tokens (a cache-only reference
    weighs what its bytes in the local UUID store do, one the gateway does not hold a default)."""
    routed = []
    for plan in plans:
        image = plan.image if plan.image is not None else store.peek(plan.key)
        if image is None:
            routed.append(RoutedImage(plan.key, image_weight(None, None, None)))
        else:
            routed.append(RoutedImage(plan.key, image_weight(image.width, image.height, image.num_bytes)))
    return routed
