"""Start real gateways (and the embedded sim engines behind them) on loopback for tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from mmgate.config import BackendSpec, CacheSettings, GatewaySettings, MediaSettings
from mmgate.serve import RunningGateway, start_gateway
from mmgate.sim.config import SimSettings
from mmgate.sim.server import start_sim

# Fast engines: the sim's latency model divided by 1000 (tests check behaviour, not timing).
FAST_SIM = SimSettings(port=0, speedup=1000.0)


def gateway_settings(
    *, backends: tuple[BackendSpec, ...] = (), media: dict[str, Any] | None = None,
    cache: dict[str, Any] | None = None, **values: Any,
) -> GatewaySettings:
    media_settings = MediaSettings(**{"allowed_private": ("127.0.0.1",), **(media or {})})
    cache_settings = CacheSettings(**(cache or {}))
    return GatewaySettings(port=0, backends=backends, media=media_settings, cache=cache_settings, **values)


@asynccontextmanager
async def running_gateway(
    settings: GatewaySettings | None = None, *, sim: SimSettings = FAST_SIM
) -> AsyncIterator[RunningGateway]:
    """A gateway on a free loopback port; with no backends in ``settings``, embedded sims."""
    gw = await start_gateway(settings or gateway_settings(), sim_settings=sim)
    try:
        yield gw
    finally:
        await gw.stop()


@asynccontextmanager
async def running_sims(count: int = 1, sim: SimSettings = FAST_SIM) -> AsyncIterator[list[Any]]:
    """``count`` sim engines on free loopback ports."""
    servers = [await start_sim(sim.model_copy(update={"port": 0})) for _ in range(count)]
    try:
        yield servers
    finally:
        for s in servers:
            await s.stop()


def vllm_specs(servers: list[Any]) -> tuple[BackendSpec, ...]:
    return tuple(BackendSpec(kind="vllm", url=s.url, name=f"sim-{i}") for i, s in enumerate(servers))
