"""Embedded engines for the default run: ``mmgate serve`` with no ``--backend`` starts ``sim``
engines (vLLM stand-ins, not models) on free loopback ports in its own process and reaches them
over HTTP through the ``vllm`` backend, so the default run exercises the production path."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from mmgate._settings import MiB
from mmgate.config import BackendSpec, GatewaySettings
from mmgate.sim import SimSettings, start_sim

# The gateway's own caches when it runs with embedded engines (``make run`` on a laptop), unless set
# explicitly: the production defaults (512 MiB of images, 256 MiB of uuids) would hold most of a
# laptop's memory budget for a demo. The embedded engines keep vLLM's processor-cache budget: their
# entries are records of processed images, not the pixels.
EMBEDDED_LOCAL_CACHE_BYTES = 128 * MiB
EMBEDDED_UUID_STORE_BYTES = 64 * MiB
# The embedded engines stand for a vLLM deployed for agents (``--enable-auto-tool-choice
# --tool-call-parser hermes``): an agent's tools are taken (the sim calls none), where a bare
# ``vllm serve`` — and ``mmgate sim`` — refuse them.
EMBEDDED_TOOL_CALL_PARSER = "hermes"
# ... and a reasoning parser (vLLM's --reasoning-parser), so an Anthropic client's extended
# thinking (a thinking_token_budget) is taken; the sim does not think.
EMBEDDED_REASONING_PARSER = "qwen3"
# ... and with vLLM's response store (VLLM_ENABLE_RESPONSES_API_STORE=1), bounded per engine, so a
# Responses client's previous_response_id works as on OpenAI's API (``--sim-responses-store-mb 0``: none).
EMBEDDED_RESPONSES_STORE_BYTES = 32 * MiB


def embedded_defaults(settings: GatewaySettings) -> GatewaySettings:
    """``settings`` with the laptop-sized cache budgets of an embedded run, where not set."""
    cache = settings.cache
    if "local_cache_bytes" not in cache.model_fields_set:
        cache = cache.model_copy(update={"local_cache_bytes": EMBEDDED_LOCAL_CACHE_BYTES})
    update: dict[str, object] = {"cache": cache}
    if "uuid_store_bytes" not in settings.model_fields_set:
        update["uuid_store_bytes"] = EMBEDDED_UUID_STORE_BYTES
    return settings.model_copy(update=update)


async def start_embedded_engines(
    count: int, sim_settings: SimSettings | None = None, *, first_port: int = 0
) -> tuple[list[BackendSpec], Callable[[], Awaitable[None]]]:
    """Start ``count`` sim engines; return their backend specs and a function that stops them.

    With ``first_port``, engine i listens on ``first_port + i`` when that port is free (so their
    ``/metrics`` are easy to find: 8001 and 8002 beside a gateway on 8000), else on any free port.
    """
    base = sim_settings if sim_settings is not None else SimSettings()
    update: dict[str, object] = {"host": "127.0.0.1", "port": 0}
    if "tool_call_parser" not in base.model_fields_set:  # engines deployed for agents: tools taken
        update.update(enable_auto_tool_choice=True, tool_call_parser=EMBEDDED_TOOL_CALL_PARSER)
    if "reasoning_parser" not in base.model_fields_set:
        update["reasoning_parser"] = EMBEDDED_REASONING_PARSER
    if "responses_store_bytes" not in base.model_fields_set:
        update["responses_store_bytes"] = EMBEDDED_RESPONSES_STORE_BYTES
    base = base.model_copy(update=update)
    servers = []
    try:
        for i in range(count):
            wanted = first_port + i if first_port else 0
            try:
                servers.append(await start_sim(base.model_copy(update={"port": wanted})))
            except OSError:  # the port is taken: any free one will do
                servers.append(await start_sim(base))
    except BaseException:
        await asyncio.gather(*(s.stop() for s in servers), return_exceptions=True)
        raise
    specs = [BackendSpec(kind="vllm", url=s.url, name=f"sim-{i}") for i, s in enumerate(servers)]

    async def stop() -> None:
        await asyncio.gather(*(s.stop() for s in servers), return_exceptions=True)

    return specs, stop
