"""Fixtures for media tests: loaders that get closed, and a scriptable shared tier. The real image
origin fixture (``origin``) lives in tests/conftest.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from mmgate.config import CacheSettings, MediaSettings
from mmgate.media.loader import MediaLoader
from mmgate.store.types import LoadedImage

LoaderFactory = Callable[..., MediaLoader]


@pytest.fixture
async def make_loader() -> AsyncIterator[LoaderFactory]:
    """``make_loader(media={...}, cache={...}, **loader_kwargs)``; loopback opened by default."""
    loaders: list[MediaLoader] = []

    def factory(
        media: dict[str, Any] | None = None, cache: dict[str, Any] | None = None, **kwargs: Any
    ) -> MediaLoader:
        media_values: dict[str, Any] = {"allowed_private": ("127.0.0.1",)}
        media_values.update(media or {})
        loader = MediaLoader(MediaSettings(**media_values), CacheSettings(**(cache or {})), **kwargs)
        loaders.append(loader)
        return loader

    yield factory
    for loader in loaders:
        await loader.close()


class DictSharedTier:
    """An in-process implementation of the ``SharedTier`` protocol.

    The real tier (Redis) is tested in ``test_shared*``; this one lets loader tests script the
    lease outcome (``lease_granted``, ``fill_result``) and count calls. It never fails.
    """

    def __init__(self) -> None:
        self.entries: dict[str, LoadedImage] = {}
        self.lease_granted = True
        self.fill_result: LoadedImage | None = None
        self.calls: list[tuple[str, str]] = []

    async def get(self, key: str) -> LoadedImage | None:
        self.calls.append(("get", key))
        return self.entries.get(key)

    async def put(self, key: str, image: LoadedImage) -> None:
        self.calls.append(("put", key))
        self.entries[key] = image

    async def acquire_fill_lease(self, key: str) -> bool:
        self.calls.append(("acquire", key))
        return self.lease_granted

    async def wait_for_fill(self, key: str) -> LoadedImage | None:
        self.calls.append(("wait", key))
        await asyncio.sleep(0)
        return self.fill_result

    async def release_fill_lease(self, key: str) -> None:
        self.calls.append(("release", key))

    async def close(self) -> None:
        return None

    def ops(self) -> list[str]:
        return [op for op, _ in self.calls]
