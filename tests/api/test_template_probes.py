"""What a model's chat template makes of ``thinking: disabled`` and of inline system messages, probed
as vLLM probes it (``mmgate.api.anthropic.template_probes``), against real aiohttp servers on loopback
standing for a replica's ``/tokenize`` and ``/v1/messages/count_tokens``: a template that tells
``none`` apart, one that renders every effort alike, one that refuses ``none``, a backend without a
renderer (the request is then forwarded as it is); a replica that merges and one that does not, and
both in one fleet."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp
import pytest
from aiohttp import web

from mmgate.api.anthropic.template_probes import MAX_ANSWERS, TTL_S, TemplateProbes
from mmgate.backends import HTTPBackend
from mmgate.config import BackendSpec
from tests.support.apps import Handler, serving, vllm_like
from tests.support.gateway import gateway_settings, running_gateway

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
            efforts = await asyncio.gather(*(probes.disabled_effort("m", [backend]) for _ in range(10)))
            efforts.append(await probes.disabled_effort("m", [backend]))  # known now: nothing asked
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
            for i in range(MAX_ANSWERS + 8):
                assert await probes.disabled_effort(f"m{i}", [backend]) == "low"
        finally:
            await backend.close()
    known = {model for _, model, _ in probes._known}
    assert known == {f"m{i}" for i in range(8, MAX_ANSWERS + 8)}  # the longest known went


def counting_posts(merges: bool | None) -> dict[str, Handler]:
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

    return {"/tokenize": tokenize, "/v1/messages/count_tokens": count_tokens}


def counting(merges: bool | None) -> web.Application:
    app = web.Application()
    for path, handler in counting_posts(merges).items():
        app.router.add_post(path, handler)
    return app


async def test_whether_inline_system_messages_merge_is_asked_of_vllm() -> None:
    for merges in (True, False, None):
        async with serving(counting(merges)) as url:
            backend = HTTPBackend("b", "vllm", url + "/", connect_timeout_s=1.0, read_timeout_s=2.0)
            try:
                assert await TemplateProbes().merges_inline_system("m", [backend]) is merges
            finally:
                await backend.close()


async def test_replicas_that_differ_are_not_mapped_by_one_of_them() -> None:
    """A rolling upgrade: replicas of one model whose templates decide differently. The request
    could go to either, so it is mapped only when they agree; otherwise forwarded (None)."""
    cases = [((True, True), True), ((False, False), False), ((True, False), None), ((True, None), None)]
    for (first, second), agreed in cases:
        async with serving(counting(first)) as url_a, serving(counting(second)) as url_b:
            backends = [HTTPBackend(name, "vllm", url + "/", connect_timeout_s=1.0, read_timeout_s=2.0)
                        for name, url in (("a", url_a), ("b", url_b))]
            probes = TemplateProbes()
            try:
                assert await probes.merges_inline_system("m", backends) is agreed, (first, second)
                # Each replica's answer is its own, kept apart.
                assert {k: v for k, (_, v) in probes._known.items()} == {
                    ("merge_inline_system", "m", "a"): first, ("merge_inline_system", "m", "b"): second}
            finally:
                for backend in backends:
                    await backend.close()


def replica(merges: bool | None, served: list[str]) -> web.Application:
    """A vLLM-like replica of model ``m`` that answers the merge probe (``counting_posts``) and
    records which endpoint served each request: chat (mapped) or its own Messages (forwarded)."""
    async def chat(request: web.Request) -> web.Response:
        served.append(f"chat {(await request.json())['messages'][0]['role']}")
        return web.json_response({
            "id": "c", "object": "chat.completion", "model": "m", "created": 0,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})

    async def messages(request: web.Request) -> web.Response:
        await request.read()
        served.append("messages")
        return web.json_response({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
            "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 3, "output_tokens": 1}})

    return vllm_like("m", {**counting_posts(merges), "/v1/chat/completions": chat, "/v1/messages": messages})


@pytest.mark.parametrize(("merges", "expected"), [
    ((True, True), ["chat system", "chat system"]), ((False, False), ["chat user", "chat user"]),
    ((True, False), ["messages", "messages"])])
async def test_a_gateway_maps_an_inline_system_message_only_when_its_replicas_agree(
        merges: tuple[bool, bool], expected: list[str]) -> None:
    """Through a gateway of two replicas: merged (the system message first), kept in place, or, when
    the replicas' templates differ, forwarded to the replica's own ``/v1/messages``."""
    served: list[str] = []
    body = {"model": "m", "max_tokens": 4, "messages": [
        {"role": "user", "content": "a"}, {"role": "system", "content": "s"}, {"role": "user", "content": "b"}]}
    async with serving(replica(merges[0], served)) as url_a, serving(replica(merges[1], served)) as url_b, \
            running_gateway(gateway_settings(backends=(BackendSpec(kind="vllm", url=url_a, name="a"),
                                                       BackendSpec(kind="vllm", url=url_b, name="b")))) as gw, \
            aiohttp.ClientSession() as client:
        for _ in range(2):
            async with client.post(gw.url + "/v1/messages", json=body) as resp:
                answer = await resp.json()
                assert resp.status == 200, answer
                assert answer["content"] == [{"type": "text", "text": "ok"}]
                assert ("x-mmgate-forwarded" in resp.headers) == (merges[0] != merges[1])
    assert served == expected


async def test_an_answer_out_of_date_is_used_while_it_is_asked_again() -> None:
    """After ``TTL_S`` no request waits: the last answer serves while the replica is asked again,
    and the new answer replaces it."""
    asked: list[str] = []
    async with serving(renderer(lambda e: [1, 2], asked)) as url:
        backend = HTTPBackend("b", "vllm", url + "/", connect_timeout_s=1.0, read_timeout_s=2.0)
        probes = TemplateProbes()
        key = ("disabled_effort", "m", "b")
        probes._known[key] = (time.monotonic() - TTL_S - 1, "none")  # learnt before the template changed
        try:
            assert await probes.disabled_effort("m", [backend]) == "none"  # at once, probe running
            assert key in probes._probes
            await probes._probes[key]
            assert asked == ["none", "low"]
            assert await probes.disabled_effort("m", [backend]) == "low"
        finally:
            await backend.close()


async def test_a_chat_backend_with_no_probe_paths_is_answered_as_one() -> None:
    """A backend that serves neither ``/tokenize`` nor count_tokens (404: a chat-only engine) has
    no template to ask, nor one that counts Messages but has no ``/tokenize`` (the embedded sim:
    Messages over its chat); a 404 that is vLLM's error object (a model it does not serve) is no answer."""
    async def unknown_model(_: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "The model `m` does not exist.", "type": "NotFoundError",
                                            "code": 404}}, status=404)

    async def count(_: web.Request) -> web.Response:
        return web.json_response({"input_tokens": 9})

    refusing = web.Application()
    for path in ("/tokenize", "/v1/messages/count_tokens"):
        refusing.router.add_post(path, unknown_model)
    counting = web.Application()
    counting.router.add_post("/v1/messages/count_tokens", count)
    async with serving(web.Application()) as bare, serving(refusing) as vllm, serving(counting) as sim:
        backends = [HTTPBackend(name, "vllm", url + "/", connect_timeout_s=1.0, read_timeout_s=2.0)
                    for name, url in (("bare", bare), ("vllm", vllm), ("sim", sim))]
        try:
            assert await TemplateProbes().disabled_effort("m", backends[:1]) == "none"
            assert await TemplateProbes().merges_inline_system("m", backends[:1]) is False
            assert await TemplateProbes().disabled_effort("m", backends[1:2]) is None
            assert await TemplateProbes().merges_inline_system("m", backends[1:2]) is None
            assert await TemplateProbes().disabled_effort("m", backends[2:]) == "none"
            assert await TemplateProbes().merges_inline_system("m", backends[2:]) is False
        finally:
            for backend in backends:
                await backend.close()


async def test_the_embedded_sims_take_what_a_claude_code_like_agent_sends() -> None:
    """``make run``'s default: a gateway with embedded sims maps inline system messages and
    ``thinking: disabled`` onto chat, so their images are reused (forwarded, they would not be)."""
    async with running_gateway() as gw, aiohttp.ClientSession() as client:
        async with client.get(gw.url + "/v1/models") as resp:
            model = (await resp.json())["data"][0]["id"]
        body = {"model": model, "max_tokens": 4, "thinking": {"type": "disabled"}, "messages": [
            {"role": "user", "content": "a"}, {"role": "system", "content": "reminder"}, {"role": "user", "content": "b"}]}
        for stream in (False, True):
            async with client.post(gw.url + "/v1/messages", json={**body, "stream": stream}) as resp:
                text = await resp.text()
                assert resp.status == 200, text
                assert "x-mmgate-forwarded" not in resp.headers
            assert ("message_stop" in text) if stream else ('"type":"message"' in text.replace(" ", ""))
