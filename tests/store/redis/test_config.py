"""build_shared_tier: a bad configuration fails start-up naming the setting; no server needed."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection
from redis.exceptions import MovedError

from mmgate._settings import build
from mmgate.config import CacheSettings, MediaSettings
from mmgate.errors import ConfigError
from mmgate.store.redis.client import build_client
from mmgate.store.redis.nodes import ClusterNodes, StandaloneNodes
from mmgate.store.redis.tier import RedisSharedTier, build_shared_tier


def _build(url: str | None, *, cluster: bool = False) -> RedisSharedTier | None:
    tier = build_shared_tier(CacheSettings(redis_url=url, redis_cluster=cluster), MediaSettings(),
                             CollectorRegistry())
    assert tier is None or isinstance(tier, RedisSharedTier)
    return tier


def test_no_url_means_no_shared_tier() -> None:
    assert _build(None) is None
    assert _build("") is None


@pytest.mark.parametrize(
    ("url", "cluster", "setting", "fragment"),
    [
        ("unix:///tmp/redis.sock", True, "--redis-cluster", "unix socket"),
        ("unix://", False, "--redis-url", "socket path"),
        ("redis://", False, "--redis-url", "without a host"),
        ("redis://127.0.0.1:notaport", False, "--redis-url", "invalid Redis URL"),
        ("redis://127.0.0.1:6379/3", True, "--redis-url", "database 0"),
        ("redis://127.0.0.1:6379?socket_timeout=5", False, "--redis-url", "--redis-io-timeout"),
        ("redis://127.0.0.1:6379?retry_on_timeout=yes", True, "--redis-url", "never retries"),
        ("redis://127.0.0.1:6379?bogus=1", False, "--redis-url", "bogus"),
        ("redis://127.0.0.1:6379?max_connections=many", False, "--redis-url", "max_connections"),
    ],
)
def test_bad_configuration_names_the_setting(url: str, cluster: bool, setting: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        _build(url, cluster=cluster)
    assert info.value.setting == setting
    assert fragment in info.value.message


def test_password_never_appears_in_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        _build("redis://:hunter2@127.0.0.1:6379?bogus=1")
    assert "hunter2" not in info.value.message


def test_bad_scheme_fails_in_settings() -> None:
    with pytest.raises(ConfigError) as info:
        build(CacheSettings, redis_url="http://127.0.0.1:6379")
    assert info.value.setting == "--redis-url"


async def test_standalone_client_honours_url_and_settings() -> None:
    cache = CacheSettings(redis_url="rediss://user:secret@cache.example:6380/2?ssl_cert_reqs=none",
                          redis_connect_timeout_s=0.25, redis_io_timeout_s=0.75)
    nodes = build_client(cache)
    assert isinstance(nodes, StandaloneNodes)
    pool = nodes.client.connection_pool
    kwargs = pool.connection_kwargs
    assert pool.connection_class is SSLConnection
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("cache.example", 6380, 2)
    assert (kwargs["username"], kwargs["password"]) == ("user", "secret")
    assert kwargs["socket_connect_timeout"] == 0.25 and kwargs["socket_timeout"] == 0.75
    assert kwargs["retry"].get_retries() == 0
    assert pool.timeout == 1.0  # waiting for a pooled connection is bounded like the operation
    await nodes.aclose()


async def test_unix_socket_client() -> None:
    nodes = build_client(CacheSettings(redis_url="unix:///run/redis.sock"))
    assert isinstance(nodes, StandaloneNodes)
    assert nodes.client.connection_pool.connection_class is UnixDomainSocketConnection
    await nodes.aclose()


async def test_cluster_nodes_learn_the_map_through_the_configured_url_only() -> None:
    cache = CacheSettings(redis_url="rediss://:pw@cluster.example:7000", redis_cluster=True,
                          redis_connect_timeout_s=0.2, redis_io_timeout_s=0.3)
    nodes = build_client(cache)
    assert isinstance(nodes, ClusterNodes)
    assert not nodes.known and nodes.route("k") is None  # nothing learnt before start()
    moved = nodes.redirected(MovedError("1234 10.0.0.9:7001"))
    assert moved is not None and moved[0] == "10.0.0.9:7001"
    for client in (nodes.seed, moved[1]):
        pool = client.connection_pool
        kwargs = pool.connection_kwargs
        assert pool.connection_class is SSLConnection and kwargs["password"] == "pw"
        assert kwargs["socket_connect_timeout"] == 0.2 and kwargs["socket_timeout"] == 0.3
        assert kwargs["retry"].get_retries() == 0
    assert nodes.seed.connection_pool.connection_kwargs["host"] == "cluster.example"
    await nodes.aclose()
