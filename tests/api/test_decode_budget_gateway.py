"""An image whose decode costs far more CPU than its pixels justify is the client's 400 naming the
part, through a real gateway in front of a real sim engine: nothing is forwarded and nothing is
cached (the same image sent again is decoded, and refused, again), while an ordinary image still
passes. The image is a real sub-limit bomb (90 repeated progressive scans, ~0.25 s of CPU); the
gateway's budget is tightened for the test (its constants: the default budget is 10 times the
costliest ordinary image, which this bomb stays under)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from mmgate.media import decode
from tests.media.test_decode_procs import SLOW
from tests.support.bombs import progressive_jpeg
from tests.support.gateway import gateway_settings, running_gateway, running_sims, vllm_specs
from tests.support.http import post
from tests.support.images import data_url
from tests.support.serve_process import metric_value


def turn(url: str) -> dict[str, Any]:
    return {"model": "mmgate-sim-vl", "max_tokens": 1, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": url}}]}]}


async def abandoned_over_budget(url: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        return metric_value(await r.text(), "mmgate_image_decodes_abandoned_total", reason="cpu_budget")


async def test_an_image_past_its_cpu_budget_is_400_never_forwarded_nor_cached(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decode, "DECODE_CPU_FLOOR_S", 0.05)
    monkeypatch.setattr(decode, "DECODE_CPU_PER_PIXEL_S", 10e-9)  # 0.09 s for the bomb's 4 M pixels
    async with running_sims(1) as sims, running_gateway(gateway_settings(backends=vllm_specs(sims))) as gw:
        for attempt in (1, 2):
            status, body, _ = await post(gw.url, turn(data_url(SLOW, "image/jpeg")))
            assert status == 400, body
            assert "far more to decode than its 4000000 pixels justify" in body["error"]["message"]
            assert body["error"]["param"] == "messages[0].content[1]"
            assert await abandoned_over_budget(gw.url) == attempt  # decoded again: nothing was cached
        assert sims[0].stats.requests == 0
        status, body, _ = await post(gw.url, turn(data_url(progressive_jpeg(256), "image/jpeg")))
        assert status == 200, body
        assert sims[0].stats.requests == 1
