"""Real ``redis-server`` processes on loopback for tests: standalone and a 3-master cluster.

Each server runs in its own temp directory on a free port with persistence off
(``--save "" --appendonly no``); a cluster node keeps its ``nodes.conf`` there, so stopping and
starting the nodes on the same ports brings the same cluster (empty) back. ``freeze()`` sends
SIGSTOP (the kernel still accepts connections, nothing answers), ``thaw()`` SIGCONT.

Use the context managers from a module-scoped fixture::

    @pytest.fixture(scope="module")
    def standalone(tmp_path_factory):
        with running_standalone(tmp_path_factory.mktemp("redis")) as server:
            yield server
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import redis.cluster

from tests.support.ports import free_port

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
_READY_TIMEOUT_S = 10.0
_CLUSTER_SLOTS = 16384


def require_redis_server() -> None:
    """Skip the calling test module when no redis-server binary exists (``make test`` installs it)."""
    if not os.path.exists(REDIS_SERVER):
        pytest.skip("redis-server is not installed (run `make redis`)", allow_module_level=True)


class RedisServer:
    """One redis-server process on 127.0.0.1, restartable on the same port and directory."""

    def __init__(self, workdir: Path, *, cluster: bool = False, password: str | None = None,
                 tls: bool = False, extra_args: tuple[str, ...] = ()) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.cluster_port = free_port() if cluster else None
        self.cluster = cluster
        self.password = password
        self.extra_args = extra_args
        self.tls_cert = _self_signed_cert(workdir) if tls else None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        if self.tls_cert is not None:
            return f"rediss://{auth}127.0.0.1:{self.port}?ssl_ca_certs={self.tls_cert}"
        return f"redis://{auth}127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _args(self) -> list[str]:
        args = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
                "--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", "redis.log",
                "--protected-mode", "no"]
        if self.tls_cert is not None:
            args[1:3] = ["--port", "0", "--tls-port", str(self.port)]
            args += ["--tls-cert-file", str(self.tls_cert), "--tls-key-file",
                     str(self.tls_cert.with_name("key.pem")), "--tls-auth-clients", "no"]
        if self.cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                     "--cluster-port", str(self.cluster_port), "--cluster-node-timeout", "5000",
                     # A master down must not stop the others serving their own slots (a cache).
                     "--cluster-require-full-coverage", "no"]
        if self.password:
            args += ["--requirepass", self.password]
        return args + list(self.extra_args)

    def start(self) -> None:
        if self.running:
            return
        self._proc = subprocess.Popen(self._args(), cwd=self.workdir, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while True:
            if self._proc.poll() is not None:
                log = (self.workdir / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server on port {self.port} exited: {log}")
            try:
                with self.client() as c:
                    if c.ping():
                        return
            except redis.RedisError:  # not listening yet
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not answer PING")
            time.sleep(0.02)

    def stop(self) -> None:
        """Terminate the process (thawing it first) and wait for it to exit."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def restart(self) -> None:
        self.stop()
        self.start()

    def freeze(self) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGCONT)

    def client(self) -> redis.Redis:
        """A plain synchronous client straight to this process (for setup and inspection)."""
        tls = {"ssl": True, "ssl_ca_certs": str(self.tls_cert)} if self.tls_cert is not None else {}
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password,
                           socket_timeout=2, socket_connect_timeout=2, **tls)  # type: ignore[arg-type]


class RedisClusterServers:
    """Three cluster-enabled masters on loopback, slots split evenly, no replicas."""

    def __init__(self, workdir: Path, size: int = 3) -> None:
        self.nodes = [RedisServer(workdir / f"node{i}", cluster=True) for i in range(size)]
        self._created = False

    @property
    def url(self) -> str:
        """The configured address: the first node (rediscovery goes through it)."""
        return self.nodes[0].url

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        if not self._created:
            self._create()
            self._created = True
        self.wait_ready()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def restart(self) -> None:
        """Stop every node, then start them on the same ports (same cluster, no data)."""
        self.stop()
        self.start()

    def _create(self) -> None:
        per_node = _CLUSTER_SLOTS // len(self.nodes)
        for i, node in enumerate(self.nodes):
            first = i * per_node
            last = _CLUSTER_SLOTS - 1 if i == len(self.nodes) - 1 else first + per_node - 1
            with node.client() as c:
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
        # Every pair meets directly: no waiting for gossip to spread the news.
        for i, node in enumerate(self.nodes):
            with node.client() as c:
                for other in self.nodes[i + 1 :]:
                    c.execute_command("CLUSTER", "MEET", "127.0.0.1", other.port, other.cluster_port)

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        """Until every node reports cluster_state:ok and knows all nodes and slots."""
        deadline = time.monotonic() + timeout_s
        while True:
            if all(self._node_ready(node) for node in self.nodes):
                return
            if time.monotonic() > deadline:
                raise RuntimeError("redis cluster did not become ready")
            time.sleep(0.05)

    def _node_ready(self, node: RedisServer) -> bool:
        try:
            with node.client() as c:
                info = c.execute_command("CLUSTER", "INFO")
        except redis.RedisError:  # still starting
            return False
        text = info.decode() if isinstance(info, bytes) else str(info)
        fields = dict(line.split(":", 1) for line in text.split() if ":" in line)
        return (fields.get("cluster_state") == "ok"
                and fields.get("cluster_known_nodes") == str(len(self.nodes))
                and fields.get("cluster_slots_ok") == str(_CLUSTER_SLOTS))

    def client(self) -> redis.cluster.RedisCluster:
        """A plain synchronous cluster client (for setup and inspection)."""
        return redis.cluster.RedisCluster(host="127.0.0.1", port=self.nodes[0].port,
                                          socket_timeout=2, socket_connect_timeout=2)

    def nodes_for_keys(self, keys: list[str]) -> list[RedisServer]:
        """The master holding each key (one client for all the lookups)."""
        by_port = {n.port: n for n in self.nodes}
        with self.client() as c:
            return [by_port[int(c.get_node_from_key(k).port)] for k in keys]

    def node_for_key(self, key: str) -> RedisServer:
        with self.client() as c:
            node = c.get_node_from_key(key)
        return next(n for n in self.nodes if n.port == int(node.port))


def _self_signed_cert(workdir: Path) -> Path:
    """A self-signed certificate for 127.0.0.1 (``cert.pem``, key beside it in ``key.pem``)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed: no TLS test")
    workdir.mkdir(parents=True, exist_ok=True)
    cert = workdir / "cert.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(workdir / "key.pem"), "-out", str(cert)],
        check=True, capture_output=True,
    )
    return cert


@contextlib.contextmanager
def running_standalone(workdir: Path, *, password: str | None = None, tls: bool = False) -> Iterator[RedisServer]:
    """A started standalone server, stopped on exit."""
    require_redis_server()
    server = RedisServer(workdir, password=password, tls=tls)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def running_cluster(workdir: Path) -> Iterator[RedisClusterServers]:
    """A started, ready 3-master cluster, stopped on exit."""
    require_redis_server()
    cluster = RedisClusterServers(workdir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@dataclass
class RedisTarget:
    """What a parametrised test needs of either deployment: its URL and raw access."""

    kind: str
    url: str
    cluster: bool
    standalone: RedisServer | None = None
    servers: RedisClusterServers | None = None

    def raw(self) -> redis.Redis | redis.cluster.RedisCluster:
        """A synchronous client to tamper with or inspect stored keys."""
        if self.servers is not None:
            return self.servers.client()
        assert self.standalone is not None
        return self.standalone.client()
