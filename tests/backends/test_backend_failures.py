"""Backend trouble through a real gateway: a backend that is down (502), one that never came up
(502), one that is too slow (504), and a backend 4xx passed through as the client's error."""

from __future__ import annotations

import aiohttp

from mmgate.config import BackendSpec
from tests.support.gateway import FAST_SIM, gateway_settings, running_gateway, running_sims, vllm_specs
from tests.support.http import post
from tests.support.ports import free_port

MODEL = "mmgate-sim-vl"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}


async def test_backend_stopped_after_start_is_502() -> None:
    async with running_sims(1) as sims:
        async with running_gateway(gateway_settings(backends=vllm_specs(sims))) as gw:
            assert (await post(gw.url, BODY))[0] == 200
            await sims[0].stop()
            status, body, _ = await post(gw.url, BODY)
            assert status == 502
            assert body["error"]["code"] == "backend_unreachable"  # type: ignore[index]


async def test_backend_that_never_came_up_is_502() -> None:
    spec = BackendSpec(kind="vllm", url=f"http://127.0.0.1:{free_port()}", name="down")
    async with running_gateway(gateway_settings(backends=(spec,), backend_connect_timeout_s=1.0)) as gw:
        status, body, _ = await post(gw.url, BODY)
        assert status == 502, body


async def test_slow_backend_is_504_and_stalled_stream_ends_with_error_frame() -> None:
    slow = FAST_SIM.model_copy(update={"speedup": 1.0, "decode_ms_per_token": 3000.0})
    async with running_sims(1, slow) as sims:
        settings = gateway_settings(backends=vllm_specs(sims), backend_read_timeout_s=0.5)
        async with running_gateway(settings) as gw:
            status, body, _ = await post(gw.url, BODY)
            assert status == 504, body
            assert body["error"]["code"] == "backend_timeout"  # type: ignore[index]
            async with aiohttp.ClientSession() as s, s.post(
                gw.url + "/v1/chat/completions", json={**BODY, "stream": True}
            ) as r:
                raw = await r.read()
            # The engine sends its headers at once and then falls silent: the status is out, so
            # the timeout travels as the stream's last frame.
            assert r.status == 200, raw
            frames = [f for f in raw.split(b"\n\n") if f.startswith(b"data: {")]
            assert b"backend_timeout" in frames[-1]


async def test_backend_400_keeps_its_status_and_message() -> None:
    async with running_sims(1) as sims, running_gateway(gateway_settings(backends=vllm_specs(sims))) as gw:
        # The sim (like vLLM) refuses max_tokens < 1 with a 400 of its own.
        status, body, _ = await post(gw.url, {**BODY, "max_tokens": -5})
        assert status == 400, body
        assert body["error"]["message"] == "max_tokens must be at least 1, got -5."  # the engine's own words
