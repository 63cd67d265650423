"""MediaLoader: tier order, dedup, scoping, data: URLs, params, metrics (real origin on loopback)."""

from __future__ import annotations

import asyncio
import hashlib

import pytest
from prometheus_client import CollectorRegistry

from mmgate.errors import ImageTooLargeError, OriginError, UnsupportedImageError
from mmgate.media.keys import scope_key, url_key
from tests.media.conftest import DictSharedTier, LoaderFactory
from tests.support.images import data_url, make_image, truncated
from tests.support.origin import ImageOrigin


def loads(registry: CollectorRegistry) -> dict[str, float]:
    out = {}
    for outcome in ("local_hit", "shared_hit", "inflight_join", "origin", "error"):
        out[outcome] = registry.get_sample_value("mmgate_image_loads_total", {"outcome": outcome}) or 0.0
    return {k: v for k, v in out.items() if v}


async def test_second_load_is_a_local_hit(origin: ImageOrigin, make_loader: LoaderFactory) -> None:
    url = origin.add("a.png", make_image("PNG"))
    registry = CollectorRegistry()
    loader = make_loader(registry=registry)
    first = await loader.load(url)
    second = await loader.load(url.upper().replace("/IMG/A.PNG", "/img/a.png") + "#frag")
    assert second is first
    assert origin.hits["/img/a.png"] == 1
    assert loads(registry) == {"origin": 1, "local_hit": 1}
    assert registry.get_sample_value("mmgate_origin_bytes_total") == len(first.data)
    assert registry.get_sample_value("mmgate_local_cache_entries") == 1
    # The image, its key and the cache's bookkeeping: what the entry really costs.
    assert registry.get_sample_value("mmgate_local_cache_bytes") == loader.local.num_cached_bytes
    assert loader.local.num_cached_bytes > first.footprint_bytes


async def test_fifty_concurrent_loads_make_one_origin_request(
    origin: ImageOrigin, make_loader: LoaderFactory
) -> None:
    origin.add("a.png", make_image("PNG"))
    registry = CollectorRegistry()
    loader = make_loader(registry=registry)
    tasks = [asyncio.create_task(loader.load(origin.url("/gated/a.png"))) for _ in range(50)]
    await asyncio.sleep(0.05)
    origin.gate.set()
    images = await asyncio.gather(*tasks)
    assert origin.hits["/gated/a.png"] == 1
    assert len({id(i) for i in images}) == 1
    assert loads(registry) == {"origin": 1, "inflight_join": 49}


async def test_failure_is_not_cached(origin: ImageOrigin, make_loader: LoaderFactory) -> None:
    loader = make_loader()
    url = origin.url("/img/late.png")
    with pytest.raises(OriginError, match="404"):
        await loader.load(url)
    origin.add("late.png", make_image("PNG"))
    assert (await loader.load(url)).width == 64
    assert origin.hits["/img/late.png"] == 2


async def test_joined_failures_each_carry_their_own_param(
    origin: ImageOrigin, make_loader: LoaderFactory
) -> None:
    loader = make_loader()
    url = origin.url("/gated/missing.png")
    params = [f"messages[{i}].content[0]" for i in range(5)]
    tasks = [asyncio.create_task(loader.load(url, param=p)) for p in params]
    await asyncio.sleep(0.05)
    origin.gate.set()
    errors = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(e, OriginError) for e in errors)
    assert [e.param for e in errors if isinstance(e, OriginError)] == params
    assert origin.hits["/gated/missing.png"] == 1


async def test_a_cancelled_load_does_not_cancel_the_others(
    origin: ImageOrigin, make_loader: LoaderFactory
) -> None:
    origin.add("a.png", make_image("PNG"))
    loader = make_loader()
    first = asyncio.create_task(loader.load(origin.url("/gated/a.png")))
    others = [asyncio.create_task(loader.load(origin.url("/gated/a.png"))) for _ in range(3)]
    await asyncio.sleep(0.05)
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    origin.gate.set()
    images = await asyncio.gather(*others)
    assert all(i.width == 64 for i in images)
    assert origin.hits["/gated/a.png"] == 1
    assert len(loader.local) == 1


async def test_bad_image_never_enters_a_tier(origin: ImageOrigin, make_loader: LoaderFactory) -> None:
    url = origin.add("cut.png", truncated(make_image("PNG", 128, 128)))
    shared = DictSharedTier()
    registry = CollectorRegistry()
    loader = make_loader(shared=shared, registry=registry)
    for _ in range(2):
        with pytest.raises(UnsupportedImageError) as info:
            await loader.load(url, param="messages[1].content[0]")
        assert info.value.status == 400 and info.value.param == "messages[1].content[0]"
    assert len(loader.local) == 0 and shared.entries == {}
    assert shared.ops().count("release") == 2  # the lease is dropped so waiters fall back at once
    assert origin.hits["/img/cut.png"] == 2
    assert loads(registry) == {"error": 2}


async def test_data_url_repeat_is_a_local_hit(make_loader: LoaderFactory) -> None:
    registry = CollectorRegistry()
    loader = make_loader(registry=registry)
    raw = make_image("JPEG", 80, 60)
    url = data_url(raw, "image/png")  # the declared type is not trusted
    first = await loader.load(url)
    assert (first.mime, first.width, first.height) == ("image/jpeg", 80, 60)
    assert first.digest == hashlib.sha256(raw).hexdigest() and first.data == raw
    assert await loader.load(url) is first
    assert await loader.load(data_url(raw, "image/jpeg")) is first  # same payload, same entry
    assert loads(registry) == {"origin": 1, "local_hit": 2}
    assert registry.get_sample_value("mmgate_origin_bytes_total") == 0


async def test_data_url_errors(make_loader: LoaderFactory) -> None:
    loader = make_loader(media={"max_image_bytes": 1000})
    with pytest.raises(ImageTooLargeError) as info:
        await loader.load(data_url(b"x" * 2000), param="messages[0].content[2]")
    assert info.value.param == "messages[0].content[2]"
    with pytest.raises(UnsupportedImageError):
        await loader.load(data_url(b"not an image"))
    assert len(loader.local) == 0


async def test_big_data_url_is_decoded_off_the_loop(make_loader: LoaderFactory) -> None:
    data = make_image("PNG", 400, 400, noise=1.0)
    assert len(data) > 256 * 1024
    loader = make_loader()
    image = await loader.load(data_url(data))
    assert image.data == data and (await loader.load(data_url(data))) is image


async def test_session_scoping(origin: ImageOrigin, make_loader: LoaderFactory) -> None:
    url = origin.add("a.png", make_image("PNG"))
    registry = CollectorRegistry()
    loader = make_loader(cache={"session_scoping": True}, registry=registry)
    a1 = await loader.load(url, session_id="A")
    assert await loader.load(url, session_id="A") is a1
    b1 = await loader.load(url, session_id="B")
    assert b1 is not a1 and b1.data == a1.data
    assert origin.hits["/img/a.png"] == 2
    # no session: every tier bypassed, nothing stored
    entries = len(loader.local)
    await loader.load(url)
    await loader.load(url)
    assert origin.hits["/img/a.png"] == 4
    assert len(loader.local) == entries == 2
    assert loads(registry) == {"origin": 4, "local_hit": 1}


async def test_scoping_bypasses_the_shared_tier_without_a_session(
    origin: ImageOrigin, make_loader: LoaderFactory
) -> None:
    url = origin.add("a.png", make_image("PNG"))
    shared = DictSharedTier()
    loader = make_loader(cache={"session_scoping": True}, shared=shared)
    await loader.load(url)
    assert shared.calls == []
    await loader.load(url, session_id="A")
    key = scope_key(url_key(url), session_scoping=True, session_id="A")
    assert key is not None and list(shared.entries) == [key]


async def test_shared_hit_skips_the_origin(origin: ImageOrigin, make_loader: LoaderFactory) -> None:
    url = origin.add("a.png", make_image("PNG"))
    shared = DictSharedTier()
    registry = CollectorRegistry()
    filler = make_loader(shared=shared)
    filled = await filler.load(url)
    assert shared.ops() == ["get", "acquire", "put", "release"]  # release: a no-op once put dropped it
    other = make_loader(shared=shared, registry=registry)  # another gateway process
    image = await other.load(url)
    assert image.digest == filled.digest and origin.hits["/img/a.png"] == 1
    assert await other.load(url) is image  # and now a local hit
    assert loads(registry) == {"shared_hit": 1, "local_hit": 1}


async def test_waits_for_another_process_fill(origin: ImageOrigin, make_loader: LoaderFactory) -> None:
    url = origin.add("a.png", make_image("PNG"))
    source = await make_loader().load(url)
    shared = DictSharedTier()
    shared.lease_granted = False
    shared.fill_result = source
    registry = CollectorRegistry()
    loader = make_loader(shared=shared, registry=registry)
    assert await loader.load(url) is source
    assert shared.ops() == ["get", "acquire", "wait"]
    assert origin.hits["/img/a.png"] == 1 and loads(registry) == {"shared_hit": 1}


async def test_falls_back_to_the_origin_when_the_fill_never_comes(
    origin: ImageOrigin, make_loader: LoaderFactory
) -> None:
    url = origin.add("a.png", make_image("PNG"))
    shared = DictSharedTier()
    shared.lease_granted = False  # someone else holds the lease ...
    shared.fill_result = None  # ... and it expires
    loader = make_loader(shared=shared)
    image = await loader.load(url)
    assert image.width == 64 and origin.hits["/img/a.png"] == 1
    assert shared.ops() == ["get", "acquire", "wait", "put"]  # no release: it never held the lease


async def test_local_tier_bounds(origin: ImageOrigin, make_loader: LoaderFactory) -> None:
    small = make_image("PNG", 40, 40, noise=1.0)  # ~5 KB, ~11 KB with its data URL
    big = make_image("PNG", 200, 200, noise=1.0)
    loader = make_loader(cache={"local_cache_bytes": 64 * 1024, "local_max_entry_fraction": 0.5})
    for i in range(40):
        await loader.load(origin.add(f"s{i}.png", small))
        assert loader.local.num_cached_bytes <= 64 * 1024
    assert 0 < len(loader.local) < 40
    assert len(big) * 2 > 32 * 1024
    n = len(loader.local)
    await loader.load(origin.add("big.png", big))
    await loader.load(origin.url("/img/big.png"))
    assert origin.hits["/img/big.png"] == 2  # over the entry fraction: never cached
    assert len(loader.local) == n


async def test_empty_and_non_string_urls(make_loader: LoaderFactory) -> None:
    loader = make_loader()
    with pytest.raises(Exception) as info:
        await loader.load("", param="p")
    assert getattr(info.value, "status", None) == 400 and getattr(info.value, "param", None) == "p"
