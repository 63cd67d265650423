"""Backend trouble through a real gateway: a backend that is down (502), one that never came up
(502), one that is too slow (504), and a backend 4xx passed through as the client's error."""

from __future__ import annotations

import aiohttp
import orjson

from mmgate.config import BackendSpec
from mmgate.wire import free_port
from tests.support.gateway import FAST_SIM, gateway_settings, running_gateway, running_sims, vllm_specs

MODEL = "mmgate-sim-vl"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}


async def post(url: str, body: object) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/chat/completions", json=body) as r:
        return r.status, await r.json(content_type=None)


async def test_backend_stopped_after_start_is_502() -> None:
    async with running_sims(1) as sims:
        async with running_gateway(gateway_settings(backends=vllm_specs(sims))) as gw:
            assert (await post(gw.url, BODY))[0] == 200
            await sims[0].stop()
            status, body = await post(gw.url, BODY)
            assert status == 502
            assert body["error"]["code"] == "backend_unreachable"  # type: ignore[index]


async def test_backend_that_never_came_up_is_502() -> None:
    spec = BackendSpec(kind="vllm", url=f"http://127.0.0.1:{free_port()}", name="down")
    async with running_gateway(gateway_settings(backends=(spec,), backend_connect_timeout_s=1.0)) as gw:
        status, body = await post(gw.url, BODY)
        assert status == 502, body


async def test_slow_backend_is_504_and_stalled_stream_ends_with_error_frame() -> None:
    slow = FAST_SIM.model_copy(update={"speedup": 1.0, "decode_ms_per_token": 3000.0})
    async with running_sims(1, slow) as sims:
        settings = gateway_settings(backends=vllm_specs(sims), backend_read_timeout_s=0.5)
        async with running_gateway(settings) as gw:
            status, body = await post(gw.url, BODY)
            assert status == 504, body
            assert body["error"]["code"] == "backend_timeout"  # type: ignore[index]
            async with aiohttp.ClientSession() as s, s.post(
                gw.url + "/v1/chat/completions", json={**BODY, "stream": True}
            ) as r:
                raw = await r.read()
            if r.status == 200:
                frames = [f for f in raw.split(b"\n\n") if f.startswith(b"data: {")]
                assert b"backend_timeout" in frames[-1]
            else:
                assert r.status == 504


async def test_backend_400_keeps_its_status_and_message() -> None:
    async with running_sims(1) as sims, running_gateway(gateway_settings(backends=vllm_specs(sims))) as gw:
        # The sim (like vLLM) refuses max_tokens < 1 with a 400 of its own.
        status, body = await post(gw.url, {**BODY, "max_tokens": -5})
        assert status == 400, body
        assert body["error"]["message"]  # type: ignore[index]
        assert orjson.dumps(body)
