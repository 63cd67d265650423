"""Build the shared tier's node clients (redis-py asyncio) from settings, without any I/O.

A bad configuration raises ``ConfigError`` naming the setting; a server that is down is not a
configuration error (the tier fails open until it comes up). Our settings own the timeouts and
the retry policy: a URL that tries to set them is refused rather than silently overridden.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.connection import (
    Connection,
    UnixDomainSocketConnection,
    parse_url,
)
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException, RedisError

from mmgate.config import CacheSettings
from mmgate.errors import ConfigError
from mmgate.store.redis.nodes import ClusterNodes, Nodes, StandaloneNodes

URL_SETTING = "--redis-url"
CLUSTER_SETTING = "--redis-cluster"
# Connections per Redis node; beyond it an operation waits (bounded by its timeout), then misses.
MAX_CONNECTIONS = 128

# Query-string options of the URL we pass on; everything else is refused by name.
_ALLOWED_QUERY = frozenset({
    "db", "protocol", "client_name", "max_connections", "health_check_interval", "socket_keepalive",
    "ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname",
    "ssl_min_version", "ssl_ciphers",
})
_OWNED_BY_SETTINGS = frozenset({
    "socket_timeout", "socket_connect_timeout", "timeout", "retry_on_timeout", "retry_on_error",
})

SharedClient = Nodes


def operation_timeout_s(cache: CacheSettings) -> float:
    """The bound on one cache operation: one connect plus one I/O wait."""
    return cache.redis_connect_timeout_s + cache.redis_io_timeout_s


def _url_options(url: str) -> dict[str, Any]:
    try:
        options: dict[str, Any] = dict(parse_url(url))
    except ValueError as exc:  # bad port, bad query value, bad scheme: say which, never the URL
        raise ConfigError(URL_SETTING, f"invalid Redis URL: {exc}") from exc
    for name in list(options):
        if name in _OWNED_BY_SETTINGS:
            raise ConfigError(
                URL_SETTING,
                f"'{name}' in the URL is not supported: use --redis-connect-timeout and "
                "--redis-io-timeout (the shared cache never retries)",
            )
        if name not in _ALLOWED_QUERY | {"host", "port", "path", "username", "password",
                                         "connection_class"}:
            raise ConfigError(URL_SETTING, f"unsupported URL option '{name}'")
    return options


def build_client(cache: CacheSettings) -> Nodes:
    """Lazily connecting node clients for ``cache.redis_url``: one server, or a cluster reached
    through that address (``mmgate.store.redis.nodes``)."""
    url = cache.redis_url
    if not url:
        raise ConfigError(URL_SETTING, "no Redis URL configured")
    options = _url_options(url)
    connection_class = options.pop("connection_class", None) or Connection
    if connection_class is UnixDomainSocketConnection:
        if cache.redis_cluster:
            raise ConfigError(CLUSTER_SETTING, "Redis Cluster needs a redis:// or rediss:// URL, "
                                               "not a unix socket")
        if not options.get("path"):
            raise ConfigError(URL_SETTING, "unix:// URL without a socket path")
    elif not options.get("host"):
        raise ConfigError(URL_SETTING, "Redis URL without a host")
    options.setdefault("max_connections", MAX_CONNECTIONS)
    options.update(
        connection_class=connection_class,
        socket_connect_timeout=cache.redis_connect_timeout_s,
        socket_timeout=cache.redis_io_timeout_s,
        # One attempt per operation: no client-side retries, no backoff sleeps.
        retry=Retry(NoBackoff(), 0),
        # Waiting for a free pooled connection counts against the operation's bound too.
        timeout=operation_timeout_s(cache),
    )
    if cache.redis_cluster:
        db = options.pop("db", 0)
        if db:
            raise ConfigError(URL_SETTING, f"Redis Cluster has only database 0, the URL selects {db}")
    try:
        seed = _node_client(options)
        if not cache.redis_cluster:
            return StandaloneNodes(seed)

        def make_node(node_host: str, node_port: int) -> Redis:
            return _node_client({**options, "host": node_host, "port": node_port})

        return ClusterNodes(seed, str(options["host"]), make_node)
    except (TypeError, ValueError, RedisError, RedisClusterException) as exc:
        # redis-py validates arguments at construction (no I/O yet): a bad option in the URL.
        raise ConfigError(URL_SETTING, f"invalid Redis configuration: {exc}") from exc


def _node_client(options: dict[str, Any]) -> Redis:
    return Redis.from_pool(BlockingConnectionPool(**options))
