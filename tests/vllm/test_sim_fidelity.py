"""The sim (``--profile tiny-qwen2vl-cpu``) answers the fidelity corpus exactly as real vLLM does:
status, error body, processor-cache counters, usage with image tokens, ``n`` — case by case."""

from __future__ import annotations

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
    assert differing == []
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
        # An unknown previous response (these replicas store responses; the sim, like a vLLM that
        # does not, knows none: the same 404 either way).
        body = {"model": real.model, "input": "hi", "max_output_tokens": 2, "previous_response_id": "resp_0123"}
        theirs, ours = await call(real.url, "/v1/responses", body), await call(fake.url, "/v1/responses", body)
        assert ours.status == theirs.status == 404 and ours.json == theirs.json, (ours.json, theirs.json)
    finally:
        sim.stop()
