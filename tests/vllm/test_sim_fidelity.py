"""The sim (``--profile tiny-qwen2vl-cpu``) answers the fidelity corpus exactly as real vLLM does:
status, error body, processor-cache counters, usage with image tokens, ``n`` — case by case."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

from tests.support.agents import Reply, call
from tests.support.fidelity import CASES, run_corpus
from tests.support.images import data_url, make_image
from tests.support.vllm import SimProcess, VllmReplica


async def test_sim_matches_real_vllm_case_by_case(vllm_replicas: list[VllmReplica], tmp_path: Path) -> None:
    sim = SimProcess(tmp_path / "sim.log")
    sim.start(["--profile", "tiny-qwen2vl-cpu", "--speedup", "1000"])
    try:
        real = await run_corpus(vllm_replicas[1])
        fake = await run_corpus(sim)
    finally:
        sim.stop()
    assert len(real) == len(CASES)
    differing = [(r.comparable(), f.comparable()) for r, f in zip(real, fake, strict=True)
                 if r.comparable() != f.comparable()]
    assert differing == [], "\n".join(map(repr, differing))
    # The corpus exercises what it claims to: hits, misses, errors, n=2, image tokens.
    statuses = {r.status for r in real}
    assert statuses == {200, 400, 404}
    assert sum(r.hits for r in real) >= 5 and any(r.choices == 2 for r in real)


def _shape(value: Any) -> Any:
    """The keys of every object in ``value``, nested, with the JSON type of each value, not the
    value: what a client's parser relies on (ids, times and generated text differ by design)."""
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_shape(item) for item in value[:1]]
    return type(value).__name__ if value is not None else None


def _shapes(reply: Reply) -> Any:
    """A reply's status and the shape of its body, or of each of its events in order (a text's
    deltas merged, as ``Reply.normalised`` merges them)."""
    status, body = reply.normalised()
    return status, [(name, _shape(data)) for name, data in body] if reply.events else _shape(body)


async def test_sims_responses_api_has_vllms_shape(vllm_replicas: list[VllmReplica], tmp_path: Path) -> None:
    """The sim's ``/v1/responses`` (what ``make run`` serves a Responses client) answers in real
    vLLM's shape: the response object's fields, its output item, usage (the image's tokens
    counted alike), the stream's events in order, and an unknown previous response."""
    sim = SimProcess(tmp_path / "sim.log")
    sim.start(["--profile", "tiny-qwen2vl-cpu", "--speedup", "1000"])
    try:
        real, fake = vllm_replicas[1], sim
        for seed, stream in ((1, False), (2, True)):
            image = data_url(make_image("PNG", 224, 224, seed=9100 + seed), "image/png")
            body = {"model": real.model, "max_output_tokens": 3, "temperature": 0, "stream": stream,
                    "instructions": "Be terse.", "input": [{"type": "message", "role": "user", "content": [
                        {"type": "input_text", "text": "What is this?"},
                        {"type": "input_image", "image_url": image, "detail": "auto"}]}]}
            theirs, ours = await call(real.url, "/v1/responses", body), await call(fake.url, "/v1/responses", body)
            assert theirs.status == ours.status == 200 and bool(ours.events) == stream
            assert _shapes(ours) == _shapes(theirs)
            if not stream:
                assert ours.json["status"] == theirs.json["status"] == "incomplete"
                assert ours.json["usage"]["input_tokens"] == theirs.json["usage"]["input_tokens"]
        # Tools under tool_choice "auto" on an engine without a tool parser: answered, the tools
        # echoed as vLLM's request model holds them.
        for stream in (False, True):
            body = {"model": real.model, "max_output_tokens": 3, "input": "Hi.", "stream": stream, "temperature": 0,
                    "tool_choice": "auto", "tools": [{"type": "function", "name": "click",
                                                      "parameters": {"type": "object", "properties": {}}}]}
            theirs, ours = await call(real.url, "/v1/responses", body), await call(fake.url, "/v1/responses", body)
            assert theirs.status == ours.status == 200 and _shapes(ours) == _shapes(theirs)
        # An unknown previous response (these replicas store responses; the sim, like a vLLM that
        # does not, knows none: the same 404 either way).
        body = {"model": real.model, "input": "hi", "max_output_tokens": 2, "previous_response_id": "resp_0123"}
        theirs, ours = await call(real.url, "/v1/responses", body), await call(fake.url, "/v1/responses", body)
        assert ours.status == theirs.status == 404 and ours.json == theirs.json, (ours.json, theirs.json)
    finally:
        sim.stop()


def _said(response: dict[str, Any]) -> str:
    return "".join(part["text"] for item in response["output"] for part in item["content"])


async def _store_script(engine: Any, tag: str) -> list[Any]:
    """What an engine with a response store answers to one script: each step's status and shape,
    and the facts that must hold on both (ids kept, a continuation's prompt = its history sent whole)."""
    def blank(reply: Reply) -> Any:
        return reply.status, _shape(reply.json) if reply.status == 200 else \
            {k: (v.replace(tag, "TAG") if isinstance(v, str) else v) for k, v in reply.json["error"].items()}

    base = {"model": engine.model, "max_output_tokens": 3, "temperature": 0}
    seen: list[Any] = []
    one = await call(engine.url, "/v1/responses", {**base, "input": "Name a colour.", "instructions": "Be terse.",
                                                   "request_id": f"resp_{tag}1"})
    seen += [blank(one), one.json["id"] == f"resp_{tag}1"]
    got = await call(engine.url, f"/v1/responses/resp_{tag}1", method="GET")
    seen += [got.status, got.json == one.json]
    two = await call(engine.url, "/v1/responses", {**base, "input": "Another.", "previous_response_id": f"resp_{tag}1"})
    whole = await call(engine.url, "/v1/responses", {**base, "store": False, "input": [
        {"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": _said(one.json)},
        {"role": "user", "content": "Another."}]})
    seen += [blank(two), two.json["previous_response_id"] == f"resp_{tag}1",
             two.json["usage"]["input_tokens"] == whole.json["usage"]["input_tokens"]]
    seen.append(blank(await call(engine.url, f"/v1/responses/resp_{tag}1/cancel")))
    await call(engine.url, "/v1/responses", {**base, "input": "x", "store": False, "request_id": f"resp_{tag}3"})
    seen.append(blank(await call(engine.url, f"/v1/responses/resp_{tag}3", method="GET")))
    seen.append((await call(engine.url, "/v1/responses", {**base, "input": "x", "background": True,
                                                           "store": False})).status)
    queued = await call(engine.url, "/v1/responses", {**base, "input": "Later.", "background": True,
                                                      "request_id": f"resp_{tag}4"})
    seen += [blank(queued), queued.json["status"]]
    for _ in range(600):
        done = await call(engine.url, f"/v1/responses/resp_{tag}4", method="GET")
        if done.json["status"] != "queued":
            break
        await asyncio.sleep(0.1)
    seen += [blank(done), done.json["status"], done.json["usage"]["output_tokens"]]
    streamed = await call(engine.url, "/v1/responses", {**base, "input": "Stream.", "background": True,
                                                        "stream": True, "request_id": f"resp_{tag}5"})
    again = await call(engine.url, f"/v1/responses/resp_{tag}5?stream=true&starting_after=2", method="GET")
    seen += [_shapes(streamed), _shapes(again), len(again.events) == len(streamed.events) - 3]
    return seen


async def test_sims_response_store_answers_as_vllms(vllm_replicas: list[VllmReplica], tmp_path: Path) -> None:
    """With ``--responses-store-mb`` the sim keeps responses as real vLLM does with
    ``VLLM_ENABLE_RESPONSES_API_STORE=1``: named by ``request_id``, read back, continued with the
    conversation they were made of, run in the background (whole and streamed, read again from an
    event), refused to cancel once done; the same statuses, shapes and errors, step by step."""
    sim = SimProcess(tmp_path / "sim.log")
    sim.start(["--profile", "tiny-qwen2vl-cpu", "--speedup", "1000", "--responses-store-mb", "64"])
    try:
        tag = uuid.uuid4().hex[:8]
        theirs, ours = await _store_script(vllm_replicas[1], tag), await _store_script(sim, tag)
    finally:
        sim.stop()
    assert ours == theirs
    # The facts hold, not merely alike: the id kept, read back whole, the continuation's previous
    # id and prompt, a background response queued then answered, its stream read again.
    assert theirs[1] is theirs[3] is theirs[5] is theirs[6] is theirs[-1] is True
    assert (theirs[11], theirs[13], theirs[14]) == ("queued", "incomplete", 3)


async def test_a_completion_is_named_by_its_x_request_id_as_vllm_names_it(vllm_replicas: list[VllmReplica],
                                                                          tmp_path: Path) -> None:
    sim = SimProcess(tmp_path / "sim.log")
    sim.start(["--profile", "tiny-qwen2vl-cpu", "--speedup", "1000"])
    try:
        for stream in (False, True):
            body = {"model": sim.model, "max_tokens": 2, "stream": stream,
                    "messages": [{"role": "user", "content": "Hi."}]}
            for engine in (vllm_replicas[1], sim):
                named = await call(engine.url, "/v1/chat/completions", body, headers={"X-Request-Id": "fid-req-7"})
                ids = {data["id"] for _, data in named.events if isinstance(data, dict)} if stream else {named.json["id"]}
                assert ids == {"chatcmpl-fid-req-7"}, (engine.url, ids)
    finally:
        sim.stop()


def _messages_cases(model: str) -> dict[str, dict[str, Any]]:
    """Messages requests, valid and not, for the sim's ``/v1/messages`` against vLLM's: the
    gateway's differential corpus and its bad input (tests/vllm/test_messages.py), streamed
    variants, and the ``thinking`` shapes vLLM's request model judges."""
    from tests.vllm.test_messages import BAD, CORPUS

    cases = {name: {**body, "model": model} for name, body in CORPUS.items() if name != "unknown-model"}
    cases |= {f"{name} (streamed)": {**cases[name], "stream": True} for name in ("text", "image", "tools-auto")}
    cases |= {f"bad: {name}": {**body, "model": model} for name, body in BAD.items()
              if isinstance(body, dict) and name != "unknown-model" and "url" not in name}
    cases["unknown model"] = {**cases["text"], "model": "no-such-model"}
    text = cases["text"]
    for name, thinking, max_tokens in (
            ("thinking under 1024", {"type": "enabled", "budget_tokens": 500}, 4000),
            ("thinking not under max_tokens", {"type": "enabled", "budget_tokens": 2048}, 2048),
            ("thinking as a string", {"type": "enabled", "budget_tokens": "2048"}, 4000),
            ("thinking adaptive", {"type": "adaptive"}, 6),
            ("thinking of no known type", {"type": "sometimes"}, 6)):
        cases[name] = {**text, "thinking": thinking, "max_tokens": max_tokens}
    return cases


def _answer(reply: Reply) -> Any:
    """What a client relies on: the status, and the body's shape (an error's: which of vLLM's two
    shapes, and Anthropic's error type); a message's stop reason and input tokens; a count's."""
    if reply.status >= 400:
        body = reply.json
        return reply.status, sorted(body), body["error"]["type"] if body.get("type") == "error" else None
    if reply.events:
        return _shapes(reply)
    if "input_tokens" in reply.json:  # count_tokens
        return reply.json
    return _shapes(reply), reply.json["stop_reason"], reply.json["usage"]["input_tokens"]


async def test_sims_messages_api_answers_as_vllms(vllm_replicas: list[VllmReplica], tmp_path: Path) -> None:
    """The sim's ``/v1/messages`` and its ``count_tokens`` (vLLM serves Anthropic's Messages over
    its chat; so does the sim) answer as real vLLM's, case by case: statuses, the message's and the
    stream's shapes, stop reasons, input tokens and counts (images included), and each error in the
    shape vLLM gives it."""
    sim = SimProcess(tmp_path / "sim.log")
    sim.start(["--profile", "tiny-qwen2vl-cpu", "--speedup", "1000"])
    try:
        real = vllm_replicas[1]
        differing, statuses, counts = [], set(), 0
        for name, body in _messages_cases(real.model).items():
            for path in ("/v1/messages", "/v1/messages/count_tokens"):
                theirs = _answer(await call(real.url, path, body))
                ours = _answer(await call(sim.url, path, body))
                statuses.add(theirs[0] if isinstance(theirs, tuple) and isinstance(theirs[0], int) else 200)
                counts += isinstance(theirs, dict)
                if theirs != ours:
                    differing.append((path, name, theirs, ours))
    finally:
        sim.stop()
    assert differing == [], "\n".join(map(repr, differing))
    assert {200, 400, 404} <= statuses  # the corpus reaches answers and both error shapes
    assert counts >= 10, counts  # and counts
