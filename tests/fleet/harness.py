"""The fleet on one machine, every part a real process on loopback: N ``mmgate serve`` gateways that
discover their engines through a DNS server (dnslib, on 127.0.0.1), the engines (``mmgate sim``, or
real vLLM) on 127.0.0.2, .3, … with one port as the pods of a headless Service, and a 3-master
Redis Cluster shared by the gateways (images, uuid store, routing sync).

Blocking steps (start, stop, wait for health) are plain functions: call them through
``asyncio.to_thread`` while a workload runs on the event loop.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.fleet.dns import Records, loopback_dns
from tests.support.ports import free_port
from tests.support.redis_servers import RedisClusterServers, running_cluster

DNS_NAME = "vllm.fleet.test"
TENANT_SECRET = "fleet-tenant-secret-0123456789"
ROUTING_SYNC_SECRET = "fleet-routing-sync-secret-0123456789abcdef"
MMGATE = [sys.executable, "-m", "mmgate"]


def healthy(url: str, path: str = "/health", timeout_s: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url + path, timeout=timeout_s) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def metric(url: str, name: str) -> float:
    """The sum of one metric's samples at ``url``/metrics (0 when absent or unreachable)."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith((name + " ", name + "{")))


@dataclass
class Child:
    """One child process in its own process group, logging to a file; restartable."""

    name: str
    argv: list[str]
    url: str
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    health: str = "/health"
    proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, env={**os.environ, **self.env})
        deadline = time.monotonic() + timeout_s
        while not healthy(self.url, self.health):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"{self.name} did not start:\n{self.log()}")
            time.sleep(0.1)

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout_s: float) -> int | None:
        """The exit status, or None if still running after ``timeout_s``."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL to the whole group (a gateway's front door, vLLM's engine core) and reap."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, wait (bounded), then kill whatever is left of the group."""
        self.signal(signal.SIGTERM)
        code = self.wait(timeout_s)
        self.kill()
        return code

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""


@dataclass
class Fleet:
    """The running fleet: its gateways, engines (by address), DNS records and Redis Cluster."""

    gateways: list[Child]
    engines: dict[str, Child]
    records: Records
    redis: RedisClusterServers
    engine_port: int
    model: str

    def publish(self, addresses: Sequence[str]) -> None:
        """The headless Service's answer from now on."""
        self.records.set(DNS_NAME, list(addresses))

    def backend_names(self, addresses: Sequence[str]) -> set[str]:
        return {f"{a}:{self.engine_port}" for a in addresses}

    def wait_backends(self, count: int, timeout_s: float = 30.0) -> float:
        """Until every running gateway routes to ``count`` backends; the seconds it took."""
        started = time.monotonic()
        while not all(metric(g.url, "mmgate_backends") == count for g in self.gateways):
            if time.monotonic() - started > timeout_s:
                raise RuntimeError(f"gateways did not reach {count} backends")
            time.sleep(0.1)
        return time.monotonic() - started


def engine_child(address: str, port: int, workdir: Path, *, vllm: bool, speedup: float) -> Child:
    """A sim engine (or a real vLLM replica: ``tests.support.vllm``'s setup) on ``address:port``."""
    url = f"http://{address}:{port}"
    log_path = workdir / f"engine-{address}.log"
    if not vllm:
        argv = [*MMGATE, "sim", "--host", address, "--port", str(port), "--speedup", str(speedup)]
        return Child(f"sim {address}", argv, url, log_path)
    from tests.support.vllm import SERVED_MODEL, VLLM_ARGS, VLLM_ENV, VllmSetup

    setup = VllmSetup.locate()
    argv = [str(setup.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(setup.model_dir),
            "--served-model-name", SERVED_MODEL, "--host", address, "--port", str(port), *VLLM_ARGS]
    return Child(f"vllm {address}", argv, url, log_path, env=VLLM_ENV)


def gateway_child(index: int, workdir: Path, dns_server: str, redis_url: str, engine_port: int,
                  extra: Sequence[str] = ()) -> Child:
    port = free_port()
    sync_secret = workdir / "routing-sync-secret"
    sync_secret.write_text(ROUTING_SYNC_SECRET)
    argv = [*MMGATE, "serve", "--port", str(port), "--backend-dns", f"vllm=http://{DNS_NAME}:{engine_port}",
            "--backend-dns-server", dns_server, "--backend-dns-interval", "0.5", "--redis-url", redis_url,
            "--redis-cluster", "--routing-sync", "--routing-sync-secret-file", str(sync_secret),
            "--drain-timeout", "10", "--allowed-private", "127.0.0.1",
            "--backend-dns-allowed", "127.0.0.0/8", *extra]
    return Child(f"gateway {index}", argv, f"http://127.0.0.1:{port}", workdir / f"gateway-{index}.log",
                 env={"MMGATE_TENANT_SECRET": TENANT_SECRET, "PYTHONUNBUFFERED": "1"})


@contextlib.contextmanager
def running_fleet(workdir: Path, *, gateways: int = 3, addresses: Sequence[str] = ("127.0.0.2", "127.0.0.3"),
                  spare: Sequence[str] = ("127.0.0.4",), vllm: bool = False, speedup: float = 1000.0,
                  gateway_args: Sequence[str] = ()) -> Iterator[Fleet]:
    """Start the whole fleet (engines for ``addresses`` and the ``spare`` ones, only ``addresses``
    published in DNS); stop everything on exit."""
    from tests.support.vllm import SERVED_MODEL

    engine_port = free_port()
    engines = {a: engine_child(a, engine_port, workdir, vllm=vllm, speedup=speedup) for a in [*addresses, *spare]}
    started: list[Child] = []
    with loopback_dns() as (records, dns_server), running_cluster(workdir / "redis") as redis:
        try:
            for engine in engines.values():
                engine.start(timeout_s=600 if vllm else 60)
                started.append(engine)
            records.set(DNS_NAME, list(addresses))
            children = [gateway_child(i, workdir, dns_server, redis.url, engine_port, gateway_args)
                        for i in range(gateways)]
            for child in children:
                child.start()
                started.append(child)
            yield Fleet(children, engines, records, redis, engine_port, SERVED_MODEL if vllm else "mmgate-sim-vl")
        finally:
            for child in reversed(started):
                child.stop(timeout_s=15)
