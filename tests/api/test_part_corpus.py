"""The differential contract: every part shape of ``tests/support/part_corpus.py`` sent by tenant B
through a real gateway whose backend is a recording proxy in front of a sim engine (which, like
vLLM, fetches the http(s) URLs it is given). Fails on any case where a backend would load a URL or
honour a uuid that the gateway did not police or namespace first:

* the loopback "secret" origin (refused by the URL policy) is never hit, by the gateway or the backend;
* with vLLM's own parser as the oracle (its ``_parse_chat_message_content_mm_part``, run by the vLLM
  venv's interpreter), every URL vLLM would load from what the gateway forwarded is a ``data:`` URL or
  the allowed origin, and every uuid it would honour is in tenant B's namespace.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.support.part_corpus import CASES, CorpusRun, corpus_run
from tests.support.vllm import VllmReplica, VllmUnavailable
from tests.support.vllm_parser import VllmParser, vllm_python


@pytest.fixture(scope="module")
def vllm_parser() -> Iterator[VllmParser]:
    """vLLM's own parser. Like the real-vLLM fixture: a missing vLLM venv fails (``make test`` builds
    it); only ``MMGATE_SKIP_VLLM=1`` skips, never under CI."""
    if os.environ.get("MMGATE_SKIP_VLLM") == "1" and not os.environ.get("CI"):
        pytest.skip("MMGATE_SKIP_VLLM=1: real-vLLM tests skipped on request")
    try:
        python = vllm_python()
    except VllmUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    parser = VllmParser(python)
    yield parser
    parser.close()


@pytest.fixture
async def corpus(tmp_path: Path) -> AsyncIterator[CorpusRun]:
    async with corpus_run(tmp_path) as run:
        yield run


CANONICAL_TYPES = {"text", "input_text", "output_text", "refusal", "thinking", "tool_reference",
                   "image_url", "video_url", "audio_url", "input_audio"}


def test_the_corpus_covers_every_media_key_vllm_reads() -> None:
    from mmgate.api.content_parts import KEY_ORDER, MEDIA_KEYS

    shapes = {k for _, part in CASES if isinstance(part, dict) for k in part}
    assert set(KEY_ORDER) <= shapes and MEDIA_KEYS - {"input_image"} <= shapes


async def test_no_case_reaches_a_backend_unpoliced(corpus: CorpusRun) -> None:
    assert corpus.secret_hits == 0
    for outcome in corpus.outcomes:
        assert outcome.gateway_status < 500, outcome
        for part in outcome.forwarded:
            if isinstance(part, str):
                continue
            assert part.get("type") in CANONICAL_TYPES, (outcome.name, part)
            if "uuid" in part:
                assert part["uuid"].startswith(corpus.tag_b + "/"), (outcome.name, part)
    refused = {o.name for o in corpus.outcomes if o.gateway_status >= 400}
    assert "image_url object, secret URL" in refused and "image_pil null + A's backend key" in refused


async def test_what_vllm_would_act_on_after_the_gateway_was_policed(corpus: CorpusRun, vllm_parser: VllmParser) -> None:
    acted = 0
    for outcome in corpus.outcomes:
        for reading in vllm_parser.read(outcome.forwarded):
            if reading.url is not None:
                acted += 1
                assert reading.url.startswith("data:") or reading.url == corpus.allowed, (outcome.name, reading)
            if reading.honoured_uuid is not None:
                acted += 1
                assert reading.honoured_uuid.startswith(corpus.tag_b + "/"), (outcome.name, reading)
    assert acted > 10  # the oracle really read media in what was forwarded
    # And the oracle is vLLM's reading, not ours: it acts on the raw attack shapes the gateway refused.
    raw = {o.name: r for o in corpus.outcomes for r in vllm_parser.read([o.part])}
    assert raw["text part with image_url + uuid (by key)"].url is not None
    assert raw["image_pil null + A's backend key"].honoured_uuid is not None
    assert raw["input_image string, secret URL"].url is not None


async def test_real_vllm_behind_the_gateway_fetches_nothing_unpoliced(
    vllm_replicas: list[VllmReplica], tmp_path: Path
) -> None:
    """The same corpus with real vLLM as the backend (which fetches URLs itself): through the
    gateway the secret origin is never hit and every uuid vLLM saw is in B's namespace. Sent to vLLM
    directly, the same parts do reach the secret origin: the corpus does exercise vLLM's fetches."""
    replica = vllm_replicas[0]
    async with corpus_run(tmp_path, backend=(replica.url, replica.model), direct=True) as run:
        assert run.secret_hits == 0
        for outcome in run.outcomes:
            # vLLM itself answers 500 to some parts (a PNG as a video_url): the gateway relays that
            # as 502 (backend trouble), never a 500 of its own.
            assert outcome.gateway_status != 500, outcome
            for part in outcome.forwarded:
                if isinstance(part, dict) and "uuid" in part:
                    assert part["uuid"].startswith(run.tag_b + "/"), (outcome.name, part)
        assert run.secret_hits_direct > 0
