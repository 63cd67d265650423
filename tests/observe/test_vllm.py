"""Operability against real vLLM (CPU build, tiny Qwen2-VL): the request id the gateway sends
becomes vLLM's own request id, and every ``vllm:`` metric the dashboard reads is one a real
replica exports."""

from __future__ import annotations

import aiohttp
import orjson

from mmgate.config import BackendSpec
from tests.observe.dashboard import exported, names_in, panels
from tests.support.gateway import gateway_settings, running_gateway
from tests.support.images import png_data_url
from tests.support.vllm import VllmReplica


async def test_vllm_takes_the_request_id_and_exports_the_dashboards_metrics(vllm_replicas: list[VllmReplica]) -> None:
    replica = vllm_replicas[0]
    settings = gateway_settings(backends=(BackendSpec(kind="vllm", url=replica.url, name="vllm-0"),))
    async with running_gateway(settings) as gw, aiohttp.ClientSession() as s:
        model = gw.gateway.router.models[0] if gw.gateway.router.models else None
        body = {"max_tokens": 2, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": png_data_url(seed=5)}}]}]}
        if model is not None:
            body["model"] = model
        headers = {"Content-Type": "application/json", "X-Request-Id": "obs-vllm-1"}
        async with s.post(gw.url + "/v1/chat/completions", data=orjson.dumps(body), headers=headers) as r:
            answer = await r.json()
            assert r.status == 200, answer
            assert r.headers["X-Request-Id"] == "obs-vllm-1"
        # vLLM built its request id from the header (serving.py ``_base_request_id``).
        assert answer["id"] == "chatcmpl-obs-vllm-1"
        async with s.get(replica.url + "/metrics") as r:
            page = await r.text()
    names = exported(page)
    wanted = {n for p in panels() for t in p["targets"] for n in names_in(t["expr"]) if n.startswith("vllm:")}
    assert wanted and not wanted - names, f"vLLM does not export {sorted(wanted - names)}"
