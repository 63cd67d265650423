"""How deep a request's JSON may nest is a setting (``--max-json-depth`` / ``MMGATE_MAX_JSON_DEPTH``),
through a real ``mmgate serve`` process: at the limit a request is served (forwarded to the engine
and answered), one level past it is a 400 naming the setting, never a 500; a large body of too
many objects is a 400 on every API (``mmgate.jsonbody.MAX_CONTAINERS``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from mmgate.jsonbody import MAX_CONTAINERS
from tests.support.agents import call, is_anthropic_error, is_openai_error
from tests.support.gateway import running_gateway
from tests.support.serve_process import serve_process


def nested_body(depth: int) -> bytes:
    """A chat request whose JSON nests ``depth`` levels (the body itself is level 1)."""
    deep: Any = "x"
    for _ in range(depth - 1):
        deep = {"k": deep}
    # The standard library's writer: orjson's stops at 254 levels.
    return json.dumps({"model": "mmgate-sim-vl", "max_tokens": 1,
                       "messages": [{"role": "user", "content": "hi"}], "zzz": deep}).encode()


async def status_of(url: str, depth: int) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.post(
            url + "/v1/chat/completions", data=nested_body(depth), headers={"Content-Type": "application/json"}) as r:
        return r.status, await r.json(content_type=None)


async def assert_limit(url: str, limit: int) -> None:
    status, body = await status_of(url, limit)
    assert status == 200, body
    status, body = await status_of(url, limit + 1)
    assert status == 400, body
    assert body["error"]["type"] == "invalid_request_error"
    assert f"deeper than {limit} levels" in body["error"]["message"] and "--max-json-depth" in body["error"]["message"]


async def test_default_depth_is_64(tmp_path: Path) -> None:
    with serve_process(tmp_path) as gw:
        await assert_limit(gw.url, 64)


async def test_the_flag_sets_it_up_to_what_the_gateway_can_forward(tmp_path: Path) -> None:
    # 254 is orjson's own limit for writing the body back out: served, not a 500.
    with serve_process(tmp_path, "--max-json-depth", "254") as gw:
        await assert_limit(gw.url, 254)


async def test_the_variable_sets_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MMGATE_MAX_JSON_DEPTH", "8")
    with serve_process(tmp_path) as gw:
        await assert_limit(gw.url, 8)


def test_a_limit_the_gateway_could_not_forward_is_refused_at_start() -> None:
    from mmgate._settings import ConfigError
    from mmgate.cli import build_parser
    from mmgate.serve.cli import settings_from_args

    with pytest.raises(ConfigError, match="--max-json-depth"):
        settings_from_args(build_parser().parse_args(["serve", "--max-json-depth", "255"]))


async def test_a_body_of_too_many_objects_is_a_400_on_every_api() -> None:
    """A few MB of tiny objects would parse to ~20 times their size and hold the loop (a 27 MB body
    held it ~4 s): past ``jsonbody.MAX_CONTAINERS`` every API answers a 400 in its own shape, no 500."""
    parts = [{"type": "text", "text": "a"}] * (MAX_CONTAINERS + 1)
    bodies = {
        "/v1/chat/completions": {"model": "mmgate-sim-vl", "messages": [{"role": "user", "content": parts}]},
        "/v1/messages": {"model": "mmgate-sim-vl", "max_tokens": 1, "messages": [{"role": "user", "content": parts}]},
        "/v1/responses": {"model": "mmgate-sim-vl", "input": [{"role": "user", "content": parts}]},
        "/tokenize": {"model": "mmgate-sim-vl", "messages": [{"role": "user", "content": parts}]},
    }
    async with running_gateway() as gw:
        for path, body in bodies.items():
            reply = await call(gw.url, path, body)
            shaped = is_anthropic_error(reply) if path == "/v1/messages" else is_openai_error(reply)
            assert reply.status == 400 and shaped and "JSON objects and arrays" in reply.raw.decode(), (path, reply.raw)
        ok = await call(gw.url, "/v1/chat/completions", {"model": "mmgate-sim-vl", "max_tokens": 1,
                                                          "messages": [{"role": "user", "content": parts[:1000]}]})
        assert ok.status == 200, ok.raw
