"""Fixtures shared across the test packages: real redis-server processes and a real image origin,
all on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from tests.support.origin import ImageOrigin
from tests.support.redis_servers import (
    RedisClusterServers,
    RedisServer,
    RedisTarget,
    running_cluster,
    running_standalone,
)


@pytest.fixture(scope="module")
def standalone_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real standalone redis-server for the test module."""
    with running_standalone(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="module")
def cluster_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    """A real 3-master Redis Cluster for the test module."""
    with running_cluster(tmp_path_factory.mktemp("cluster")) as servers:
        yield servers


@pytest.fixture(scope="module", params=["standalone", "cluster"])
def redis_target(request: pytest.FixtureRequest) -> RedisTarget:
    """Each test using it runs twice: against the standalone server and against the cluster."""
    if request.param == "cluster":
        servers: RedisClusterServers = request.getfixturevalue("cluster_servers")
        return RedisTarget("cluster", servers.url, True, servers=servers)
    server: RedisServer = request.getfixturevalue("standalone_server")
    return RedisTarget("standalone", server.url, False, standalone=server)


@pytest.fixture
async def origin() -> AsyncIterator[ImageOrigin]:
    """A real aiohttp image origin on 127.0.0.1 that counts requests per path."""
    server = await ImageOrigin().start()
    try:
        yield server
    finally:
        await server.stop()
