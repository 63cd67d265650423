"""``tools`` and ``tool_choice`` on the sim's chat completions, checked as vLLM 0.32 checks them:
refused where vLLM without ``--enable-auto-tool-choice``/``--tool-call-parser`` refuses (the
messages are vLLM's, proven against it by ``tests/vllm/test_sim_fidelity.py``'s corpus), taken
with them (the sim calls no tool: it answers text), and taken by the engines ``mmgate serve``
embeds, which stand for a vLLM deployed for agents."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from mmgate.sim.config import SimSettings
from tests.support.agents import call
from tests.support.gateway import running_gateway

MODEL = "mmgate-sim-vl"
TOOLS = [{"type": "function", "function": {"name": "click", "parameters": {"type": "object", "properties": {}}}}]
CLICK = {"type": "function", "function": {"name": "click"}}
AUTO = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'


def ask(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "Where do I click?"}], **fields}


async def post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.post(url + "/v1/chat/completions", json=body) as resp:
        return resp.status, await resp.json()


@pytest.mark.parametrize(("fields", "parser", "status", "message"), [
    ({"tools": TOOLS}, False, 400, AUTO),
    ({"tools": TOOLS, "tool_choice": "auto", "stream": True}, False, 400, AUTO),
    ({"tools": TOOLS, "tool_choice": "none"}, False, 200, None),
    ({"tools": TOOLS, "tool_choice": "required"}, False, 400, 'tool_choice="required" requires --tool-call-parser'),
    ({"tools": TOOLS, "tool_choice": CLICK}, False, 400, 'tool_choice=function "click" requires --tool-call-parser'),
    ({"tool_choice": "required"}, False, 400, "When using `tool_choice`, `tools` must be set."),
    ({"tools": TOOLS}, True, 200, None),
    ({"tools": TOOLS, "tool_choice": "required"}, True, 200, None),
    ({"tools": TOOLS, "tool_choice": CLICK}, True, 200, None),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "scroll"}}}, True, 400,
     "The tool specified in `tool_choice` does not match any of the specified `tools`"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, True, 400, "'tool_choice' must be"),
    ({"tools": "click"}, True, 400, "'tools' must be a list."),
])
async def test_tools_are_checked_as_vllm_checks_them(make_sim: Any, fields: dict[str, Any], parser: bool,
                                                     status: int, message: str | None) -> None:
    sim = await make_sim(**({"enable_auto_tool_choice": True, "tool_call_parser": "hermes"} if parser else {}))
    got, body = await post(sim.url, ask(**fields))
    assert got == status, body
    if message is None:
        assert body["choices"][0]["message"]["content"] and sim.stats.requests == 1
    else:
        assert body["error"]["message"].startswith(message) and body["error"]["code"] == 400


def test_auto_tool_choice_needs_a_parser() -> None:
    with pytest.raises(ValueError, match="requires --tool-call-parser"):
        SimSettings(enable_auto_tool_choice=True)


async def test_the_engines_mmgate_serve_embeds_take_an_agents_tools() -> None:
    async with running_gateway() as gw:
        reply = await call(gw.url, "/v1/chat/completions", ask(tools=TOOLS))
        assert reply.status == 200 and reply.json["choices"][0]["message"]["content"], reply.json

