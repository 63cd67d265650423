"""Fixtures for the sim's tests: real engines on free loopback ports."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from mmgate.sim.config import SimSettings
from mmgate.sim.server import SimServer, start_sim
from tests.sim.helpers import FAST

SimFactory = Callable[..., Awaitable[SimServer]]


@pytest.fixture
async def make_sim() -> AsyncIterator[SimFactory]:
    """Start engines with setting overrides; all are stopped at the end of the test."""
    servers: list[SimServer] = []

    async def factory(**overrides: Any) -> SimServer:
        server = await start_sim(SimSettings(**{**FAST, **overrides}))
        servers.append(server)
        return server

    yield factory
    for server in servers:
        await server.stop()


@pytest.fixture
async def sim(make_sim: SimFactory) -> SimServer:
    return await make_sim()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session
