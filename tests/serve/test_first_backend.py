"""``mmgate serve`` with discovered backends and none ready yet (a first deploy, a vLLM outage): a
real process on loopback, its backends named by a real DNS server, stays up — ``/load`` 200,
``/health`` and the API 503 — until a name answers, then serves; SIGHUP while it waits is ignored
and SIGTERM ends it with status 0; ``--backend-dns-start-timeout`` bounds the wait (exit 2 past it)."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import pytest

from mmgate._settings import ConfigError
from mmgate.serve.first_backend import start_timeout_s
from tests.backends.echo_server import echo_backend
from tests.fleet.dns import loopback_dns
from tests.support.ports import free_port

MMGATE = [sys.executable, "-m", "mmgate", "serve"]
NAME = "vllm.fleet.test"
START_S = 30.0


@contextmanager
def gateway_process(tmp_path: Path, dns_server: str, backend_port: int, *extra: str,
                    env: dict[str, str] | None = None) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``mmgate serve`` discovering ``NAME`` through ``dns_server`` (loopback opened to it)."""
    port = free_port()
    log = (tmp_path / f"gateway-{port}.log").open("wb")
    proc = subprocess.Popen(
        [*MMGATE, "--port", str(port), "--backend-dns", f"vllm=http://{NAME}:{backend_port}",
         "--backend-dns-server", dns_server, "--backend-dns-allowed", "127.0.0.1",
         "--backend-dns-interval", "0.2", *extra],
        env={**os.environ, **(env or {})}, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        log.close()


async def status_of(session: aiohttp.ClientSession, url: str) -> int | None:
    try:
        async with session.get(url) as reply:
            await reply.read()
            return reply.status
    except aiohttp.ClientError:
        return None


async def until_status(session: aiohttp.ClientSession, url: str, want: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_S
    while await status_of(session, url) != want:
        assert proc.poll() is None, f"the gateway exited with status {proc.returncode}"
        assert time.monotonic() < deadline, f"{url} never answered {want}"
        await asyncio.sleep(0.1)


async def wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return proc.poll()


async def test_a_gateway_with_no_backend_stays_up_unready_then_serves(tmp_path: Path) -> None:
    chat = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
    async with echo_backend(models=("m1",)) as echo, aiohttp.ClientSession() as session:
        backend_port = int(echo.url.rsplit(":", 1)[1])
        with loopback_dns() as (records, dns_server), \
                gateway_process(tmp_path, dns_server, backend_port,
                                env={"MMGATE_BACKEND_DNS_START_TIMEOUT": "0"}) as (proc, url):
            await until_status(session, url + "/load", 200, proc)
            assert await status_of(session, url + "/health") == 503
            async with session.post(url + "/v1/chat/completions", json=chat) as reply:
                assert reply.status == 503
                assert reply.headers["Retry-After"] == "5"
                assert (await reply.json())["error"]["code"] == "no_backend"
            await asyncio.sleep(1.0)  # several re-resolutions with no answer: still up
            assert proc.poll() is None
            records.set(NAME, ["127.0.0.1"])
            await until_status(session, url + "/health", 200, proc)
            async with session.post(url + "/v1/chat/completions", json=chat) as reply:
                assert reply.status == 200
            proc.send_signal(signal.SIGTERM)
            assert await wait_exit(proc, 15) == 0


async def test_sighup_is_ignored_and_sigterm_ends_a_waiting_gateway_cleanly(tmp_path: Path) -> None:
    async with aiohttp.ClientSession() as session:
        with loopback_dns() as (_, dns_server), \
                gateway_process(tmp_path, dns_server, 8000, "--backend-dns-start-timeout", "0") as (proc, url):
            await until_status(session, url + "/load", 200, proc)
            proc.send_signal(signal.SIGHUP)  # a reload loop's signal must not end a waiting gateway
            await asyncio.sleep(0.5)
            assert await status_of(session, url + "/load") == 200
            proc.send_signal(signal.SIGTERM)
            assert await wait_exit(proc, 5) == 0


def test_past_the_start_timeout_the_gateway_exits_naming_the_flag(tmp_path: Path) -> None:
    with loopback_dns() as (_, dns_server), \
            gateway_process(tmp_path, dns_server, 8000, "--backend-dns-start-timeout", "0.5") as (proc, _):
        assert proc.wait(timeout=START_S) == 2
    log = next(tmp_path.glob("gateway-*.log")).read_text()
    assert "no backend found in 0.5 s" in log and "--backend-dns-start-timeout 0" in log


def test_start_timeout_flag_then_variable_then_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MMGATE_BACKEND_DNS_START_TIMEOUT", raising=False)
    assert start_timeout_s(argparse.Namespace(backend_dns_start_timeout=None)) == 30.0
    assert start_timeout_s(argparse.Namespace(backend_dns_start_timeout=2.5)) == 2.5
    monkeypatch.setenv("MMGATE_BACKEND_DNS_START_TIMEOUT", "0")
    assert start_timeout_s(argparse.Namespace(backend_dns_start_timeout=None)) == math.inf
    for bad in ("-1", "soon", "nan"):
        monkeypatch.setenv("MMGATE_BACKEND_DNS_START_TIMEOUT", bad)
        with pytest.raises(ConfigError, match="--backend-dns-start-timeout"):
            start_timeout_s(argparse.Namespace(backend_dns_start_timeout=None))
