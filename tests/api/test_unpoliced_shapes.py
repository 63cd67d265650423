"""Shapes vLLM reads media or URLs from that the gateway's URL policy cannot see are refused with
a 400 naming the field, or policed: through a real gateway in front of a sim engine, nothing of a
refused request is sent."""

from __future__ import annotations

from typing import Any

import pytest

from mmgate.config import BackendSpec
from tests.support.agents import call, is_openai_error
from tests.support.gateway import gateway_settings, running_gateway, running_sims

MODEL = "mmgate-sim-vl"
IMAGE = "http://10.0.0.1/cat.png"  # a private address the URL policy refuses


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", {"model": MODEL, "prompt": "x", "multi_modal_data": {"image": IMAGE}}, "multi_modal_data"),
    ("/v1/completions", {"model": MODEL, "prompt": [{"prompt_token_ids": [1, 2],
                                                     "multi_modal_data": {"image": IMAGE}}]},
     "prompt[0].multi_modal_data"),
    ("/pooling", {"model": MODEL, "data": {"data": IMAGE, "data_format": "url"}}, "data"),
    ("/pooling", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "multi_modal_data": {}},
     "multi_modal_data"),
    ("/v1/responses", {"model": MODEL, "input": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": IMAGE}}]}]}, "input[0].content[0]"),
    ("/v1/responses", {"model": MODEL, "input": [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": IMAGE}}]}]}, "input[0].content[0]"),
    ("/v1/responses", {"model": MODEL, "input": [{"type": "message", "content": [
        {"type": "input_image", "image_url": IMAGE}]}]}, "input[0].role"),
    ("/v1/responses", {"model": MODEL, "input": "hi", "tools": [
        {"type": "mcp", "server_label": "x", "server_url": "http://10.0.0.1/mcp"}]}, "tools[0].server_url"),
    ("/v1/responses", {"model": MODEL, "input": "hi", "tools": [
        {"type": "mcp", "server_label": "x", "server_url": "file:///etc/passwd"}]}, "tools[0].server_url"),
    ("/v1/responses", {"model": MODEL, "input": "hi", "tools": [
        {"type": "mcp", "server_label": "x", "server_url": 5}]}, "tools[0].server_url"),
])
async def test_refused_with_a_400_naming_the_field(path: str, body: dict[str, Any], param: str) -> None:
    async with running_sims() as (sim,), running_gateway(
            gateway_settings(backends=(BackendSpec(kind="vllm", url=sim.url, name="r0"),))) as gw:
        reply = await call(gw.url, path, body)
        assert reply.status == 400 and is_openai_error(reply), reply.raw
        error = reply.json["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error", error
        assert sim.stats.requests == 0  # nothing reached the engine


async def test_an_mcp_server_url_the_policy_allows_is_forwarded() -> None:
    async with running_sims() as (sim,), running_gateway(
            gateway_settings(backends=(BackendSpec(kind="vllm", url=sim.url, name="r0"),))) as gw:
        reply = await call(gw.url, "/v1/responses", {"model": MODEL, "input": "hi", "tools": [
            {"type": "mcp", "server_label": "x", "server_url": "http://127.0.0.1:9/mcp"}]})
        assert reply.status == 200 and sim.stats.requests == 1, reply.raw
