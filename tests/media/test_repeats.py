"""A repeated data: URL is found by its fingerprint and confirmed by its text, without SHA-256
(``mmgate.media.repeats``); nothing unconfirmed is ever served from it."""

from __future__ import annotations

import base64
import hashlib
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

import mmgate.media.checks as checks_module
import mmgate.media.loader as loader_module
from mmgate.api.image_loads import load_urls
from mmgate.errors import ImageTooLargeError, UnsupportedImageError
from mmgate.media.dataurl import DataURL
from tests.media.conftest import LoaderFactory
from tests.support.images import data_url, make_image


@pytest.fixture
def sha_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Counts the loader's keyings of data: URLs (a base64 decode and a SHA-256 of the bytes)."""
    calls: list[str] = []
    real = loader_module.decoded_digest

    def counted(parsed: DataURL) -> tuple[bytes, str]:
        calls.append(parsed.payload[:16])
        return real(parsed)

    monkeypatch.setattr(loader_module, "decoded_digest", counted)
    return calls


@pytest.fixture
def hashes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of what the loader hashes with SHA-256."""
    sizes: list[int] = []

    def sha256(data: bytes) -> Any:
        sizes.append(len(data))
        return hashlib.sha256(data)

    monkeypatch.setattr(checks_module, "hashlib", SimpleNamespace(sha256=sha256))
    return sizes


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
async def test_a_new_image_is_hashed_once(make_loader: LoaderFactory, hashes: list[int], fmt: str) -> None:
    """Its key and its digest are one SHA-256 of its bytes (the PNG checked on the loop, the JPEG
    decoded in a worker process and hashed in the pool)."""
    raw = make_image(fmt, 120, 80, seed=9)
    image = await make_loader().load(data_url(raw, f"image/{fmt.lower()}"))
    assert hashes == [len(raw)]
    assert image.digest == hashlib.sha256(raw).hexdigest()


async def test_every_spelling_of_the_same_bytes_is_one_entry(make_loader: LoaderFactory) -> None:
    """Keyed by its decoded bytes, an image sent again under another type label or with
    non-canonical base64 is a local hit on the entry the first spelling made."""
    registry = CollectorRegistry()
    loader = make_loader(registry=registry)
    raw = next(r for seed in range(3, 50) if len(r := make_image("PNG", 64, 48, seed=seed)) % 3 == 2)
    canonical = base64.b64encode(raw).decode()
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    odd = canonical[:-2] + alphabet[alphabet.index(canonical[-2]) | 1] + "="
    first = await loader.load("data:image/png;base64," + canonical)
    assert await loader.load("data:image/png;base64," + odd) is first
    assert await loader.load("data:image/x-png;base64," + canonical) is first
    assert registry.get_sample_value("mmgate_image_loads_total", {"outcome": "origin"}) == 1
    assert registry.get_sample_value("mmgate_image_loads_total", {"outcome": "local_hit"}) == 2


async def test_a_repeat_costs_no_sha256(make_loader: LoaderFactory, sha_calls: list[str]) -> None:
    registry = CollectorRegistry()
    loader = make_loader(registry=registry)
    url = data_url(make_image("PNG", 120, 80, seed=1))
    first = await loader.load(url)
    assert len(sha_calls) == 1
    for _ in range(3):
        assert await loader.load(url) is first
    assert len(sha_calls) == 1
    assert registry.get_sample_value("mmgate_image_loads_total", {"outcome": "local_hit"}) == 3


async def test_a_fingerprint_collision_serves_the_right_image(
    make_loader: LoaderFactory, sha_calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every text gets the same fingerprint: the index then names the wrong key for the second
    image, the text comparison refuses it, and each URL still loads its own bytes."""
    monkeypatch.setattr(loader_module, "fingerprint", lambda _parsed: b"\x00" * 16)
    loader = make_loader()
    one, two = make_image("PNG", 64, 48, seed=1), make_image("PNG", 64, 48, seed=2)
    assert (await loader.load(data_url(one))).data == one
    assert (await loader.load(data_url(two))).data == two
    assert (await loader.load(data_url(one))).data == one
    assert (await loader.load(data_url(two))).data == two
    assert len(sha_calls) == 4  # nothing confirmed: every load keyed by SHA-256


async def test_text_that_is_not_the_forwarded_encoding_takes_the_sha_path(
    make_loader: LoaderFactory, sha_calls: list[str]
) -> None:
    """Base64 whose padding bits are not zero decodes to the same bytes but is not the text the
    gateway forwards: it is not confirmed, so it is keyed (and refused or served) as before."""
    raw = next(r for seed in range(3, 50) if len(r := make_image("PNG", 64, 48, seed=seed)) % 3 == 2)
    canonical = base64.b64encode(raw).decode()  # one padding character: its last symbol has 2 spare bits
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    odd = canonical[:-2] + alphabet[alphabet.index(canonical[-2]) | 1] + "="
    assert odd != canonical and base64.b64decode(odd) == raw
    loader = make_loader()
    first = await loader.load("data:image/png;base64," + odd)
    again = await loader.load("data:image/png;base64," + odd)
    assert first.data == raw and again is first
    assert len(sha_calls) == 2


async def test_another_tenants_image_is_not_reached_by_its_fingerprint(
    make_loader: LoaderFactory, sha_calls: list[str]
) -> None:
    registry = CollectorRegistry()
    loader = make_loader(registry=registry)
    url = data_url(make_image("PNG", 80, 60, seed=4))
    mine = await loader.load(url, tenant_tag="a")
    theirs = await loader.load(url, tenant_tag="b")
    assert theirs is not mine and theirs.data == mine.data
    assert registry.get_sample_value("mmgate_image_loads_total", {"outcome": "origin"}) == 2
    assert await loader.load(url, tenant_tag="b") is theirs
    assert len(sha_calls) == 2


async def test_the_index_is_bounded(make_loader: LoaderFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader_module, "REPEAT_INDEX_ENTRIES", 3)
    loader = make_loader()
    for seed in range(8):
        await loader.load(data_url(make_image("PNG", 16, 16, seed=seed)))
    assert len(loader._repeats) == 3


async def test_a_repeat_over_a_lowered_byte_limit_is_refused(make_loader: LoaderFactory) -> None:
    """The size check a parse makes still holds for a repeat found by its fingerprint (a reload
    can lower ``max_image_bytes``)."""
    loader = make_loader()
    raw = make_image("PNG", 120, 80, seed=5)
    url = data_url(raw)
    await loader.load(url)
    loader._media = loader._media.model_copy(update={"max_image_bytes": len(raw) - 1})
    with pytest.raises(ImageTooLargeError):
        await loader.load(url)


async def test_a_held_repeat_is_found_at_once_in_its_own_space(make_loader: LoaderFactory) -> None:
    """``MediaLoader.held``: the repeat ``load`` would answer from the local tier, without a task,
    and nothing else (not another tenant's, not another spelling, not a URL it has not seen)."""
    registry = CollectorRegistry()
    loader = make_loader(registry=registry)
    raw = make_image("PNG", 80, 60, seed=6)
    url = data_url(raw)
    assert loader.held(url, tenant_tag="a") is None  # not seen yet
    image = await loader.load(url, tenant_tag="a")
    assert loader.held(url, tenant_tag="a") is image
    assert loader.held(url, tenant_tag="b") is None  # another tenant's space
    assert loader.held(url) is None  # no tenant: another space too
    assert loader.held("data:image/x-png;base64," + url.split(",", 1)[1], tenant_tag="a") is None  # another spelling
    assert loader.held("https://example.com/a.png", tenant_tag="a") is None  # not a data: URL
    assert registry.get_sample_value("mmgate_image_loads_total", {"outcome": "local_hit"}) == 1


async def test_a_turn_loads_only_its_new_image(make_loader: LoaderFactory, sha_calls: list[str]) -> None:
    """An agent's turn through ``load_urls``: its repeats taken as held, its new image loaded, each
    answered in the request's order."""
    registry = CollectorRegistry()
    loader = make_loader(registry=registry)
    old = [data_url(make_image("PNG", 64, 48, seed=seed)) for seed in (7, 8)]
    held = [await loader.load(url) for url in old]
    new = data_url(make_image("PNG", 64, 48, seed=9))
    got = await load_urls(loader, [("p0", old[0]), ("p1", new), ("p2", old[1])], None, None)
    assert got[0] is held[0] and got[2] is held[1] and got[1].data == base64.b64decode(new.split(",", 1)[1])
    assert len(sha_calls) == 3  # the two earlier loads and the new image: no repeat hashed
    assert registry.get_sample_value("mmgate_image_loads_total", {"outcome": "local_hit"}) == 2
    assert registry.get_sample_value("mmgate_image_loads_total", {"outcome": "origin"}) == 3
    with pytest.raises(UnsupportedImageError) as info:
        await load_urls(loader, [("p0", old[0]), ("p1", "data:image/png;base64,AAAA")], None, None)
    assert info.value.param == "p1"
