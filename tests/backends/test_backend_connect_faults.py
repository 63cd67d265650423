"""Connect failures of every kind fail over to the next backend; a read timeout after the request
was sent stays a 504 and is not sent elsewhere. Real gateway, real sims, a real TCP proxy in front
of the first backend that is switched into each fault after the gateway has seen it healthy."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest

from mmgate.config import BackendSpec
from mmgate.serve import RunningGateway
from tests.support.flaky_proxy import FlakyProxy, Mode
from tests.support.gateway import gateway_settings, running_gateway, running_sims

MODEL = "mmgate-sim-vl"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}
CONNECT_S = 0.5
READ_S = 0.75


async def post(gw: RunningGateway, session: str) -> tuple[int, str, float]:
    start = time.monotonic()
    async with aiohttp.ClientSession() as s, s.post(
        gw.url + "/v1/chat/completions", json=BODY, headers={"x-session-id": session}
    ) as r:
        await r.read()
        return r.status, r.headers.get("x-mmgate-backend", ""), time.monotonic() - start


@asynccontextmanager
async def flaky_first() -> AsyncIterator[tuple[RunningGateway, FlakyProxy, str]]:
    """A gateway over (flaky proxy → sim 0, sim 1) and a session whose first choice is the proxy."""
    async with running_sims(2) as sims:
        proxy = await FlakyProxy(sims[0].port).start()
        specs = (BackendSpec(kind="vllm", url=proxy.url, name="flaky"),
                 BackendSpec(kind="vllm", url=sims[1].url, name="steady"))
        # No probes, no load polls and no ejection during the test: each request meets the fault
        # itself, and the proxy counts the request's connections only.
        settings = gateway_settings(backends=specs, backend_connect_timeout_s=CONNECT_S,
                                    backend_read_timeout_s=READ_S, health_interval_s=60,
                                    eject_after_failures=100)
        try:
            async with running_gateway(settings) as gw:
                session = next(f"s{i}" for i in range(1000)
                               if gw.gateway.router.ranked(MODEL, f"s{i}")[0].name == "flaky")
                assert (await post(gw, session))[:2] == (200, "flaky")
                yield gw, proxy, session
        finally:
            await proxy.stop()


@pytest.mark.parametrize("mode", ["refuse", "blackhole", "reset"])
async def test_connect_failure_fails_over(mode: Mode) -> None:
    async with flaky_first() as (gw, proxy, session):
        await proxy.set_mode(mode)
        status, backend, elapsed = await post(gw, session)
        assert (status, backend) == (200, "steady")
        assert elapsed < CONNECT_S + 2.0  # one connect bound, then the other backend's answer


async def test_read_timeout_after_the_request_was_sent_is_504_without_failover() -> None:
    async with flaky_first() as (gw, proxy, session):
        await proxy.set_mode("stall")
        status, _, elapsed = await post(gw, session)
        assert status == 504
        assert proxy.accepted == 1  # the request reached the first backend ...
        assert elapsed >= READ_S  # ... which was given its full read timeout, and nothing else
