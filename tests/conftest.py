"""Fixtures shared across the test packages: real redis-server processes, a real image origin and
real vLLM replicas, all on loopback."""

from __future__ import annotations

import os
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
from tests.support.vllm import VllmReplica, VllmSetup, VllmUnavailable, running_replicas


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


# A test that uses real vLLM may wait for the replicas' start (60-90 s each, in parallel, on 2
# shared cores) on top of its own bounded requests: it gets this timeout instead of the default.
VLLM_TEST_TIMEOUT_S = 600


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "vllm_replicas" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(VLLM_TEST_TIMEOUT_S))


@pytest.fixture(scope="session")
def vllm_replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[VllmReplica]]:
    """Two real vLLM replicas (CPU build, tiny Qwen2-VL, dummy weights), started once per session
    in parallel, stopped at its end. See ``tests/support/vllm.py``.

    A missing vLLM venv fails the tests that use it (``make test`` builds it with ``make vllm``);
    only an explicit ``MMGATE_SKIP_VLLM=1`` skips them, and never under CI.
    """
    with running_replicas(2, tmp_path_factory.mktemp("vllm"), setup=located_vllm()) as replicas:
        yield replicas


def located_vllm() -> VllmSetup:
    """The vLLM venv and model: a missing venv fails the test; ``MMGATE_SKIP_VLLM=1`` skips it
    (never under CI)."""
    if os.environ.get("MMGATE_SKIP_VLLM") == "1" and not os.environ.get("CI"):
        pytest.skip("MMGATE_SKIP_VLLM=1: real-vLLM tests skipped on request")
    try:
        return VllmSetup.locate()
    except VllmUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
