"""build_shared_tier: a bad configuration fails start-up naming the setting; no server needed."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection

from mmgate._settings import build
from mmgate.config import CacheSettings, MediaSettings
from mmgate.errors import ConfigError
from mmgate.store.redis.client import build_client
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
    client = build_client(cache)
    assert isinstance(client, Redis)
    kwargs = client.connection_pool.connection_kwargs
    assert client.connection_pool.connection_class is SSLConnection
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("cache.example", 6380, 2)
    assert (kwargs["username"], kwargs["password"]) == ("user", "secret")
    assert kwargs["socket_connect_timeout"] == 0.25 and kwargs["socket_timeout"] == 0.75
    assert kwargs["retry"].get_retries() == 0
    await client.aclose()


async def test_unix_socket_client() -> None:
    client = build_client(CacheSettings(redis_url="unix:///run/redis.sock"))
    assert isinstance(client, Redis)
    assert client.connection_pool.connection_class is UnixDomainSocketConnection
    await client.aclose()


async def test_cluster_client_rediscovers_through_the_configured_url() -> None:
    cache = CacheSettings(redis_url="rediss://:pw@cluster.example:7000", redis_cluster=True,
                          redis_connect_timeout_s=0.2, redis_io_timeout_s=0.3)
    client = build_client(cache)
    assert isinstance(client, RedisCluster)
    assert client.nodes_manager._dynamic_startup_nodes is False
    assert client.retry.get_retries() == 0
    assert [(n.host, n.port) for n in client.startup_nodes] == [("cluster.example", 7000)]
    kwargs = client.connection_kwargs
    assert kwargs["connection_class"] is SSLConnection and kwargs["password"] == "pw"
    assert kwargs["socket_connect_timeout"] == 0.2 and kwargs["socket_timeout"] == 0.3
    await client.aclose()
