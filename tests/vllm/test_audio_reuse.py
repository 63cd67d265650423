"""Audio reuse against real vLLM (its CPU build with the audio extra, the tiny Qwen2-Audio of
``tools/tiny_qwen2audio.py``, dummy weights): an audio sent with a uuid is processed once; its
repeat and its uuid-only references (``input_audio`` and ``audio_url`` forms) are processor-cache
hits in vLLM's own metrics; a replica restarted with an empty cache misses the reference and the
gateway heals it with the data it checked; a uuid the gateway never saw, and a ``data:`` audio that
is no audio, are 400s naming the part; an audio sent without a uuid is reused by its content.

Its own replica of its own model, with a gateway in front, for the module.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import VLLM_TEST_TIMEOUT_S, located_vllm
from tests.media.test_audio import wav
from tests.support.gateway import gateway_settings, running_gateway, vllm_specs
from tests.support.recorder import recording_proxy
from tests.support.vllm import (
    ROOT,
    SERVED_MODEL,
    GatewayProcess,
    VllmReplica,
    VllmSetup,
    running_gateway_process,
    running_replicas,
)
from tests.vllm.conftest import GATEWAY_FLAGS
from tests.vllm.helpers import Answer, body, chat
from tests.vllm.test_heal import _until_healthy

pytestmark = pytest.mark.timeout(VLLM_TEST_TIMEOUT_S)
MODEL = "tiny-qwen2audio"


@pytest.fixture(scope="module")
def audio_replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmReplica]:
    located = located_vllm()
    setup = VllmSetup(located.python, ROOT / "build" / MODEL, located.start_timeout_s, maker="tiny_qwen2audio.py")
    with running_replicas(1, tmp_path_factory.mktemp("vllm-audio"), setup=setup,
                          extra_args=("--limit-mm-per-prompt", '{"audio": 2}')) as (replica,):
        yield replica


@pytest.fixture(scope="module")
def audio_gateway(audio_replica: VllmReplica, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    log = tmp_path_factory.mktemp("gateway-audio") / "mmgate.log"
    with running_gateway_process([audio_replica.url], log, *GATEWAY_FLAGS) as gw:
        yield gw


def input_audio(data: bytes | None, uuid: str | None = None) -> dict[str, Any]:
    value = {"data": base64.b64encode(data).decode(), "format": "wav"} if data is not None else None
    part: dict[str, Any] = {"type": "input_audio", "input_audio": value}
    if uuid is not None:
        part["uuid"] = uuid
    return part


async def ask(url: str, part: dict[str, Any], session: str) -> Answer:
    payload = body(part, text="What is this sound?")
    payload["model"] = SERVED_MODEL
    return await chat(url, payload, {"x-session-id": session})


async def test_an_audio_is_processed_once_and_its_misses_heal(
    audio_gateway: GatewayProcess, audio_replica: VllmReplica,
) -> None:
    tone = wav(2.0)
    first = await ask(audio_gateway.url, input_audio(tone, "tone-1"), "s-audio")
    assert first.status == 200, first.json
    tokens = first.json["usage"]["prompt_tokens"]

    references = (input_audio(tone, "tone-1"), input_audio(None, "tone-1"),
                  {"type": "audio_url", "audio_url": None, "uuid": "tone-1"})
    for turn in references:  # a repeat, then uuid-only references in both forms
        queries, hits = audio_replica.cache_counters()
        again = await ask(audio_gateway.url, turn, "s-audio")
        assert again.status == 200, again.json
        assert again.json["usage"]["prompt_tokens"] == tokens
        assert audio_replica.cache_counters() == (queries + 1, hits + 1)  # a processor-cache hit

    # A fresh process on the same port: its cache is empty; vLLM's real 400 ("Cache miss for audio")
    # is healed with the data the gateway checked for tone-1.
    await asyncio.to_thread(audio_replica.restart)
    await _until_healthy(audio_gateway, "vllm-0", True)
    healed = await ask(audio_gateway.url, input_audio(None, "tone-1"), "s-audio")
    assert healed.status == 200, healed.json
    assert healed.json["usage"]["prompt_tokens"] == tokens

    unknown = await ask(audio_gateway.url, input_audio(None, "never-sent"), "s-audio")
    assert unknown.status == 400, unknown.json
    assert "never-sent" in unknown.message and unknown.json["error"]["param"] == "messages[0].content[1]"

    before = audio_replica.cache_counters()
    noise = await ask(audio_gateway.url, input_audio(b"\x00" * 256, "noise"), "s-audio")
    assert noise.status == 400 and noise.json["error"]["param"] == "messages[0].content[1]", noise.json
    assert audio_replica.cache_counters() == before  # refused before vLLM saw it


async def test_an_audio_sent_without_a_uuid_is_reused_by_its_content(audio_replica: VllmReplica) -> None:
    """The gateway keys a checked data: audio by its content, as an image: the repeat goes to vLLM
    as a reference (seen by a recording proxy in front of it), a processor-cache hit."""
    unlabelled = input_audio(wav(1.0, freq=660.0))
    async with recording_proxy(audio_replica.url) as rec, \
            running_gateway(gateway_settings(backends=vllm_specs([rec]))) as gw:
        first = await ask(gw.url, unlabelled, "s-audio-content")
        assert first.status == 200, first.json
        queries, hits = audio_replica.cache_counters()
        again = await ask(gw.url, unlabelled, "s-audio-content")
        assert again.status == 200, again.json
        assert audio_replica.cache_counters() == (queries + 1, hits + 1)
    sent = [b["messages"][0]["content"][1] for b in rec.bodies]
    assert sent[0]["input_audio"] == unlabelled["input_audio"] and sent[0]["uuid"].startswith("~sha256:audio-")
    assert sent[1] == {"type": "input_audio", "input_audio": None, "uuid": sent[0]["uuid"]}
