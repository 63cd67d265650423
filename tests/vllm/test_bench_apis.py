"""``mmgate bench run --api messages|responses`` against real vLLM's own /v1/messages and
/v1/responses: the sliding window goes through, images included, and each API's stream and whole
replies are read (TTFT, server-counted output tokens)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from mmgate.bench.dataset import load_dataset
from mmgate.bench.runner import run_benchmark
from mmgate.bench.settings import BenchSettings
from mmgate.bench.synth import SlidingWindowSpec, generate_sliding_window
from tests.support.vllm import VllmReplica


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("api", ["messages", "responses"])
async def test_bench_drives_vllm_as_a_messages_or_responses_client(
    vllm_replicas: list[VllmReplica], tmp_path: Path, api: str, stream: bool
) -> None:
    dataset = generate_sliding_window(SlidingWindowSpec(sessions=2, turns=3, window=2, image_size=64), tmp_path).path
    settings = BenchSettings(url=vllm_replicas[0].url, dataset=str(dataset), api=api, stream=stream,
                             concurrency=2, output_length=4, model=vllm_replicas[0].model)
    out = await run_benchmark(settings, load_dataset(dataset, "single_turn"), tmp_path / "out",
                              console=Console(file=io.StringIO()), plots=False)
    totals = out.summary["totals"]
    assert (totals["requests"], totals["errors"]) == (6, 0), out.summary
    assert totals["logical_images"] == totals["images_with_data"] == 2 * 3 * 2  # every turn: its window of 2
    assert totals["output_tokens"] == 6 * 4  # usage read from the API's own reply (dummy weights: max_tokens)
    if stream:
        assert out.summary["metrics"]["ttft_ms"]["p50"] > 0


async def test_a_stripping_responses_client_gets_real_cache_hits(
    vllm_replicas: list[VllmReplica], tmp_path: Path
) -> None:
    """vLLM's /v1/responses reads an ``input_image``'s uuid: the bench's repeats go as cache-only
    references and are processor-cache hits on the replica."""
    replica = vllm_replicas[1]
    dataset = generate_sliding_window(SlidingWindowSpec(sessions=1, turns=3, window=2, image_size=64, seed=9),
                                      tmp_path).path
    _, hits = replica.cache_counters()
    settings = BenchSettings(url=replica.url, dataset=str(dataset), api="responses", uuid_and_strip=True,
                             output_length=2, model=replica.model)
    out = await run_benchmark(settings, load_dataset(dataset, "single_turn"), None,
                              console=Console(file=io.StringIO()), plots=False)
    totals = out.summary["totals"]
    assert (totals["requests"], totals["errors"]) == (3, 0), out.summary
    assert totals["cache_only_refs"] == totals["logical_images"] - totals["images_with_data"] > 0
    _, after_hits = replica.cache_counters()
    assert after_hits - hits >= totals["cache_only_refs"]
