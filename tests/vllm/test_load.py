"""What the gateway's load poll reads from real vLLM: the scheduler gauges on ``/metrics`` in the
names and shape ``mmgate.vllm_protocol.engine_load`` parses (a replica busy with a stream reports it), and
``/load`` (0 here: the session's replicas run without ``--enable-server-load-tracking``)."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson

from mmgate.backends.http import HTTPBackend, server_load
from tests.support.vllm import VllmReplica


async def test_the_load_poll_reads_real_vllm_gauges(vllm_replicas: list[VllmReplica]) -> None:
    replica = vllm_replicas[0]
    backend = HTTPBackend("r0", "vllm", replica.url, connect_timeout_s=5.0, read_timeout_s=60.0)
    body = orjson.dumps({"model": replica.model, "stream": True, "max_tokens": 400, "ignore_eos": True,
                         "messages": [{"role": "user", "content": "count slowly"}]})
    try:
        idle = await backend.load(5.0)
        assert idle is not None and idle >= 0  # the gauges are there: a number, not "no figure"
        async with aiohttp.ClientSession() as client:
            async with client.get(replica.url + "/load") as r:
                assert r.status == 200 and server_load(await r.read()) == 0  # tracking off
        reply = await backend.chat(body, stream=True)
        assert reply.status == 200 and reply.stream is not None
        try:
            await anext(reply.stream)
            busy = 0
            async with asyncio.timeout(30):  # vLLM publishes its gauges with each engine step
                while busy < 1:
                    busy = await backend.load(5.0) or 0
                    await asyncio.sleep(0.05)
            assert busy >= 1
        finally:
            reply.release()
    finally:
        await backend.close()
