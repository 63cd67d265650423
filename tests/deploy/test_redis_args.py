"""The Redis Cluster node's command line in deploy/kubernetes/base/redis-cluster.yaml, run by a real
redis-server on loopback (port, directory and bind address swapped for the test's): every flag is
one this Redis accepts, and the node comes up in cluster mode with the password and the eviction
policy the manifest says."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import redis

from tests.deploy.manifests import BASE, container, load_file, one

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not on PATH")
PASSWORD = "test-password-1"
START_TIMEOUT_S = 10


def free_port() -> int:
    """A free port whose cluster bus port (+10000, the Redis default) is free too."""
    while True:
        with socket.socket() as sock, socket.socket() as bus:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
            if port + 10000 > 65535:
                continue
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
            return port


def node_command(port: int, data: Path) -> str:
    redis_set = one(load_file(BASE / "redis-cluster.yaml"), "StatefulSet", "redis")
    cont = container(redis_set, "redis")
    assert cont["command"] == ["sh", "-c"]
    script: str = cont["args"][0]
    assert "--port 6379" in script and "--dir /data" in script and "/data/nodes.conf" in script
    return (script.replace("--port 6379", f"--port {port} --bind 127.0.0.1")
            .replace("/data/nodes.conf", f"{data}/nodes.conf").replace("--dir /data", f"--dir {data}"))


def test_redis_node_command_runs(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "REDIS_PASSWORD": PASSWORD}
    proc = subprocess.Popen(["sh", "-c", node_command(port, tmp_path)], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    client = redis.Redis(host="127.0.0.1", port=port, password=PASSWORD, socket_timeout=2)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()[-2000:]  # type: ignore[union-attr]
            try:
                assert client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "redis-server did not answer"
                time.sleep(0.1)
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=port, password="wrong", socket_timeout=2).ping()
        assert client.info("cluster")["cluster_enabled"] == 1
        assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "allkeys-lru"
        assert client.config_get("appendonly")["appendonly"] == "no"
        assert str(client.config_get("cluster-announce-hostname")["cluster-announce-hostname"]).endswith(".redis")
    finally:
        client.close()
        proc.terminate()
        proc.wait(timeout=START_TIMEOUT_S)
        if proc.stdout is not None:
            proc.stdout.close()
