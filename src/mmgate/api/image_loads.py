"""A request's images, loaded together: the held repeats at once, the rest concurrently under one
pixel budget (its large decodes admitted all together), the first failure cancelling the others."""

from __future__ import annotations

import asyncio

from mmgate.media import MediaLoader
from mmgate.media.decode import PixelBudget
from mmgate.observe import span, traced
from mmgate.store import LoadedImage


async def load_urls(
    loader: MediaLoader, wanted: list[tuple[str, str]], session_id: str | None, tenant_tag: str | None
) -> list[LoadedImage]:
    """Each (param, URL)'s image, in order. Untraced, the repeats the local tier holds are taken
    at once (``MediaLoader.held``): an agent's turn of one new screenshot and three repeats is one
    load, not four tasks. Traced, every image is a load of its own, in its own span."""
    found: dict[int, LoadedImage] = {}
    if not traced():
        for i, (_, url) in enumerate(wanted):
            if (image := loader.held(url, session_id=session_id, tenant_tag=tenant_tag)) is not None:
                found[i] = image
    if missing := [i for i in range(len(wanted)) if i not in found]:
        loaded = await _load_concurrently(loader, [wanted[i] for i in missing], session_id, tenant_tag)
        found.update(zip(missing, loaded, strict=True))
    return [found[i] for i in range(len(wanted))]


async def _load_concurrently(
    loader: MediaLoader, wanted: list[tuple[str, str]], session_id: str | None, tenant_tag: str | None
) -> list[LoadedImage]:
    budget = loader.pixel_budget(loads=len(wanted))
    if len(wanted) == 1:
        return [await _load_one(loader, *wanted[0], session_id, budget, tenant_tag)]
    tasks = [asyncio.create_task(_load_one(loader, param, url, session_id, budget, tenant_tag))
             for param, url in wanted]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        # The first failure is the answer; the other loads are abandoned (their fetches are
        # shared through in-flight dedup and finish for any other waiter).
        for task in tasks:
            task.cancel()
        budget.abandon()  # a load cancelled before it started never reports to the budget
        raise


async def _load_one(
    loader: MediaLoader, param: str, url: str, session_id: str | None, budget: PixelBudget, tenant_tag: str | None,
) -> LoadedImage:
    """One image, in its own span (which tier answered, or the origin) when the request is traced."""
    with span("load", {"mmgate.image.param": param}) as loading:
        image, source = await loader.load_with_outcome(
            url, session_id=session_id, param=param, budget=budget, tenant_tag=tenant_tag)
        loading.set_attribute("mmgate.image.source", source)
        loading.set_attribute("mmgate.image.bytes", image.num_bytes)
    return image
