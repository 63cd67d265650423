"""A client that goes away stops its image's decode, through a real gateway in front of a real
sim engine: the request carries a costly JPEG (90 repeated progressive scans, under the structure
check's limit, ~0.25 s of Pillow's CPU and far more on a loaded machine), the client hangs up while
it decodes in a worker process the gateway started with, and that process is killed at once;
nothing reaches the backend. An image past the decode time limit is the client's 400, also never
forwarded."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from mmgate.media import decode
from mmgate.media.decode_worker import CLOCK_TICKS
from tests.media.test_decode_procs import SLOW, workers_alive
from tests.support.gateway import gateway_settings, running_gateway, running_sims, vllm_specs
from tests.support.http import post
from tests.support.images import data_url
from tests.support.serve_process import metric_value


def cpu_s(pid: int) -> float:
    """CPU seconds process ``pid`` has used (user and system, /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


async def settled(pids: Iterable[int]) -> dict[int, float]:
    """The CPU seconds of ``pids`` once none has used any for 0.1 s (a new worker's own start is over)."""
    deadline = time.monotonic() + 5.0
    now = {pid: cpu_s(pid) for pid in pids}
    while True:
        await asyncio.sleep(0.1)
        before, now = now, {pid: cpu_s(pid) for pid in now}
        if now == before:
            return now
        assert time.monotonic() < deadline, "the decode workers never went idle"


def turn(url: str) -> dict[str, Any]:
    return {"model": "mmgate-sim-vl", "max_tokens": 1, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": url}}]}]}


async def scrape(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        return await r.text()


async def test_a_client_that_hangs_up_stops_its_decode() -> None:
    async with running_sims(1) as sims, running_gateway(gateway_settings(backends=vllm_specs(sims))) as gw:
        async def client() -> None:
            async with aiohttp.ClientSession() as s, \
                    s.post(gw.url + "/v1/chat/completions", json=turn(data_url(SLOW, "image/jpeg"))) as r:
                await r.read()

        waiting = {p.pid: p for p in workers_alive() if p.pid is not None}  # started with the gateway
        cpu_before = await settled(waiting)
        request = asyncio.create_task(client())
        deadline = time.monotonic() + 10.0
        # The gateway has read, parsed and probed it once a waiting worker spends CPU: the decode runs.
        while not (busy := [pid for pid in waiting if cpu_s(pid) - cpu_before[pid] >= 0.03]):
            assert time.monotonic() < deadline and not request.done(), "the decode never started"
            await asyncio.sleep(0.02)
        (worker,) = (waiting[pid] for pid in busy)
        await asyncio.sleep(0.1)
        request.cancel()  # the client hangs up mid-decode
        await asyncio.gather(request, return_exceptions=True)
        deadline = time.monotonic() + 2.0
        while metric_value(await scrape(gw.url), "mmgate_image_decodes_abandoned_total", reason="cancelled") < 1:
            assert time.monotonic() < deadline, "the decode was not abandoned"
            await asyncio.sleep(0.05)
        deadline = time.monotonic() + 0.2  # the decode itself has ~0.4 s (far more on a loaded machine) to go
        while worker.is_alive():  # killed, not left to finish
            assert time.monotonic() < deadline, "the decode's worker still runs"
            await asyncio.sleep(0.02)
        assert sims[0].stats.requests == 0


async def test_an_image_past_the_decode_time_limit_is_400_and_not_forwarded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decode, "DECODE_TIME_LIMIT_S", 0.1)
    async with running_sims(1) as sims, running_gateway(gateway_settings(backends=vllm_specs(sims))) as gw:
        status, body, _ = await post(gw.url, turn(data_url(SLOW, "image/jpeg")))
        assert status == 400 and "took more than 0.1 s to decode" in body["error"]["message"], body
        assert body["error"]["param"] == "messages[0].content[1]"
        text = await scrape(gw.url)
        assert metric_value(text, "mmgate_image_decodes_abandoned_total", reason="time_limit") == 1
        assert sims[0].stats.requests == 0
