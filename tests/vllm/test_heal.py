"""Healing against real vLLM: a session whose replica goes away moves to the other replica, whose
cache never saw its images; a replica comes back as a fresh process with empty caches. Both
misses are vLLM's real 400 and the gateway heals each one from its uuid store. (With image-affinity
routing the session stays on the replica that holds its images once its home is back, until that
replica goes away too.)"""

from __future__ import annotations

import asyncio
import time

from tests.support.vllm import GatewayProcess, VllmReplica
from tests.vllm.helpers import body, chat, fresh_jpeg, image, replica_for


async def _until_healthy(gateway: GatewayProcess, name: str, healthy: bool, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        backends = await asyncio.to_thread(lambda: gateway.health().get("backends", []))
        if any(b["name"] == name and b["healthy"] is healthy for b in backends):  # type: ignore[union-attr]
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"gateway never saw {name} healthy={healthy}: {gateway.health()}")


async def test_heal_after_failover_and_after_a_real_restart(
    gateway: GatewayProcess, vllm_replicas: list[VllmReplica]
) -> None:
    headers = {"x-session-id": "s-heal"}
    first = await chat(gateway.url, body(image(fresh_jpeg(), "h-1")), headers)
    assert first.status == 200, first.json
    home = replica_for(first, vllm_replicas)
    other = next(r for r in vllm_replicas if r is not home)
    home_name = first.headers["x-mmgate-backend"]

    home.stop()
    try:
        # The session's replica is gone: the gateway fails over; the other replica misses h-1.
        queries, hits = other.cache_counters()
        moved = await chat(gateway.url, body(image(None, "h-1")), headers)
        assert moved.status == 200, moved.json
        assert replica_for(moved, vllm_replicas) is other
        assert moved.reuse()["healed"] == 1
        # vLLM counts no query for a reference it cannot find: only the healed request's miss.
        assert other.cache_counters() == (queries + 1, hits)
        assert moved.json["usage"]["prompt_tokens"] == first.json["usage"]["prompt_tokens"]
    finally:
        await asyncio.to_thread(home.start)  # a new vLLM process on the same port: empty caches

    await _until_healthy(gateway, home_name, True)
    # The session's images are now held by the other replica (as far as the gateway sent them): the
    # session stays there rather than go home to process them again (image-affinity routing).
    stay = await chat(gateway.url, body(image(None, "h-1")), headers)
    assert stay.status == 200, stay.json
    assert replica_for(stay, vllm_replicas) is other
    assert stay.reuse() == {"sent": 0, "stripped": 0, "referenced": 1, "healed": 0}

    # Now the other replica goes away: the session must go home, to the restarted process whose
    # cache is empty (the gateway forgot what home held when it re-admitted it, but the client's
    # reference goes as it is): vLLM's real 400 says it misses h-1 and the gateway heals.
    other_name = stay.headers["x-mmgate-backend"]
    other.stop()
    try:
        await _until_healthy(gateway, other_name, False)
        back = await chat(gateway.url, body(image(None, "h-1")), headers)
        assert back.status == 200, back.json
        assert replica_for(back, vllm_replicas) is home
        assert back.reuse()["healed"] == 1
        assert home.cache_counters() == (1, 0)

        again = await chat(gateway.url, body(image(None, "h-1")), headers)
        assert again.status == 200 and again.reuse() == {"sent": 0, "stripped": 0, "referenced": 1, "healed": 0}
        assert home.cache_counters() == (2, 1)
    finally:
        await asyncio.to_thread(other.start)
        await _until_healthy(gateway, other_name, True)
