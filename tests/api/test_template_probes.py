"""What a model's chat template makes of ``thinking: disabled`` and of inline system messages, probed
as vLLM probes it (``mmgate.api.anthropic.template_probes``), against real aiohttp servers on loopback
standing for a replica's ``/tokenize`` and ``/v1/messages/count_tokens``: a template that tells
``none`` apart, one that renders every effort alike, one that refuses ``none``, a backend without a
renderer (the request is then forwarded as it is); a replica that merges and one that does not."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from mmgate.api.anthropic.template_probes import MAX_MODELS, TemplateProbes
from mmgate.backends import HTTPBackend
from tests.support.apps import serving

Render = Callable[[str], list[int] | None]


def renderer(render: Render, asked: list[str]) -> web.Application:
    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        effort = body["chat_template_kwargs"]["reasoning_effort"]
        assert body["chat_template_kwargs"]["enable_thinking"] == (effort != "none")
        asked.append(effort)
        await asyncio.sleep(0.01)
        tokens = render(effort)
        if tokens is None:
            return web.json_response({"error": {"message": "template error"}}, status=400)
        return web.json_response({"count": len(tokens), "tokens": tokens})

    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    return app


async def probed(render: Render) -> tuple[list[str | None], list[str]]:
    """Ten concurrent requests' efforts, and the efforts the renderer was asked for."""
    asked: list[str] = []
    async with serving(renderer(render, asked)) as url:
        backend = HTTPBackend("b", "vllm", url + "/", connect_timeout_s=1.0, read_timeout_s=2.0)
        probes = TemplateProbes()
        try:
            efforts = await asyncio.gather(*(probes.disabled_effort("m", backend) for _ in range(10)))
            efforts.append(await probes.disabled_effort("m", backend))  # known now: nothing asked
        finally:
            await backend.close()
    return list(efforts), asked


async def test_a_template_that_tells_none_apart_means_none_asked_once() -> None:
    efforts, asked = await probed(lambda e: [1, 2] if e == "none" else [1, 3])
    assert efforts == ["none"] * 11
    assert asked == ["none", "low", "medium", "high", "xhigh", "max"]  # one probe for all eleven


async def test_a_template_that_ignores_the_effort_means_low() -> None:
    efforts, asked = await probed(lambda e: [1, 2])
    assert efforts == ["low"] * 11 and asked == ["none", "low"]


async def test_a_template_that_refuses_none_means_low() -> None:
    efforts, _ = await probed(lambda e: None if e == "none" else [1, 2])
    assert efforts == ["low"] * 11


async def test_no_renderer_means_unknown_and_forwarded() -> None:
    efforts, _ = await probed(lambda e: None)
    assert efforts == [None] * 11


async def test_the_models_it_knows_are_bounded() -> None:
    asked: list[str] = []
    async with serving(renderer(lambda e: [1, 2], asked)) as url:
        backend = HTTPBackend("b", "vllm", url + "/", connect_timeout_s=1.0, read_timeout_s=2.0)
        probes = TemplateProbes()
        try:
            for i in range(2 * MAX_MODELS + 8):
                assert await probes.disabled_effort(f"m{i}", backend) == "low"
        finally:
            await backend.close()
    known = {model for _, model in probes._known}
    assert known == {f"m{i}" for i in range(8, 2 * MAX_MODELS + 8)}  # the longest known went


def counting(merges: bool | None) -> web.Application:
    """A replica that counts a token a message, plus one for a system message kept apart from the
    leading one (its own role header): count_tokens counts as vLLM maps (merged or not); None: it
    cannot count."""
    def count(messages: list[dict[str, str]]) -> int:
        return len(messages) + sum(1 for i, m in enumerate(messages) if m["role"] == "system" and i > 0)

    async def tokenize(request: web.Request) -> web.Response:
        return web.json_response({"count": count((await request.json())["messages"])})

    async def count_tokens(request: web.Request) -> web.Response:
        turns = (await request.json())["messages"]
        if merges is None:
            return web.json_response({"error": {"message": "no"}}, status=404)
        systems = [m for m in turns if m["role"] == "system"]
        mapped = systems + [m for m in turns if m["role"] != "system"] if merges else turns
        return web.json_response({"input_tokens": count(mapped)})

    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
    return app


async def test_whether_inline_system_messages_merge_is_asked_of_vllm() -> None:
    for merges in (True, False, None):
        async with serving(counting(merges)) as url:
            backend = HTTPBackend("b", "vllm", url + "/", connect_timeout_s=1.0, read_timeout_s=2.0)
            try:
                assert await TemplateProbes().merges_inline_system("m", backend) is merges
            finally:
                await backend.close()
