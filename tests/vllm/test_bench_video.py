"""``mmgate bench`` driving video sessions against real vLLM (its CPU build, the tiny Qwen2-VL, video
allowed): a sliding window of clips — each turn one new clip and the last two again — sent directly
(resending every clip, or ``--uuid-and-strip``) and through a gateway, unmodified.

What reaches the engine is counted twice: by a recording proxy in front of vLLM (the exact video
bytes in the bodies it forwarded) and by vLLM's own ``/metrics`` (``--engine-metrics``: its
processor-cache hits per turn, and the request bytes it received).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from mmgate.bench.dataset import load_dataset
from mmgate.bench.runner import run_benchmark
from mmgate.bench.settings import BenchSettings
from mmgate.bench.synth import SlidingWindowSpec, generate_sliding_window
from tests.conftest import VLLM_TEST_TIMEOUT_S
from tests.support.gateway import gateway_settings, running_gateway, vllm_specs
from tests.support.recorder import Recorder, recording_proxy
from tests.support.vllm import VllmReplica, running_replicas

pytestmark = pytest.mark.timeout(VLLM_TEST_TIMEOUT_S)

TURNS, WINDOW = 4, 3
CLIPS = WINDOW + TURNS - 1  # distinct clips of the session
REPEATS = (TURNS - 1) * (WINDOW - 1)  # every turn after the first shows W-1 clips again


@pytest.fixture(scope="module")
def video_replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmReplica]:
    """The module's own replica, taking a window of clips in one prompt."""
    extra = ("--limit-mm-per-prompt", f'{{"image": 1, "video": {WINDOW}}}')
    with running_replicas(1, tmp_path_factory.mktemp("vllm-bench-video"), extra_args=extra) as (replica,):
        yield replica


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = SlidingWindowSpec(sessions=1, turns=TURNS, window=WINDOW, image_size=64, media="video", seed=5)
    return generate_sliding_window(spec, tmp_path_factory.mktemp("clips")).path


def video_bytes(rec: Recorder) -> int:
    """Characters of video data in the bodies the proxy forwarded to vLLM."""
    return sum(len(p["video_url"]["url"]) for b in rec.bodies for m in b["messages"] if isinstance(m["content"], list)
               for p in m["content"] if p["type"] == "video_url" and p["video_url"] is not None)


async def bench(url: str, dataset: Path, engine: str, prefix: str, **kw: Any) -> dict[str, Any]:
    settings = BenchSettings(url=url, dataset=str(dataset), output_length=2, model="tiny-qwen2vl",
                             engine_metrics=(engine,), session_prefix=prefix, **kw)
    out = await run_benchmark(settings, load_dataset(dataset, "single_turn"), None,
                              console=Console(file=io.StringIO()), plots=False)
    assert (out.summary["totals"]["requests"], out.summary["totals"]["errors"]) == (TURNS, 0), out.summary["errors"]
    return out.summary


def assert_a_hit_on_each_repeat(summary: dict[str, Any]) -> None:
    engine = summary["engine"]
    assert (engine["cache_queries"], engine["cache_hits"]) == (TURNS * WINDOW, REPEATS)
    assert [(t["cache_queries"], t["cache_hits"]) for t in engine["by_turn"]] == \
        [(WINDOW, 0)] + [(WINDOW, WINDOW - 1)] * (TURNS - 1)


async def test_a_video_window_through_the_gateway_reaches_vllm_once(
    video_replica: VllmReplica, clips: Path,
) -> None:
    """An unmodified client resends its window every turn; the gateway sends each clip to vLLM once:
    video bytes to the engine / unique = 1.00, and each repeat is a processor-cache hit."""
    async with recording_proxy(video_replica.url) as rec, \
            running_gateway(gateway_settings(backends=vllm_specs([rec]))) as gw:
        summary = await bench(gw.url, clips, video_replica.url, "gw-")
    totals = summary["totals"]
    assert (totals["logical_videos"], totals["videos_with_data"], totals["unique_videos"]) == \
        (TURNS * WINDOW, TURNS * WINDOW, CLIPS)
    assert video_bytes(rec) == totals["unique_video_bytes"]  # 1.00 at the engine
    assert totals["video_bytes_per_unique"] == pytest.approx(TURNS * WINDOW / CLIPS, rel=0.05)  # the client's
    assert_a_hit_on_each_repeat(summary)
    # vLLM's own request-byte count agrees with the proxy within the gateway's envelope rewrites.
    assert summary["engine"]["video_bytes_est_per_unique"] == pytest.approx(1.0, abs=0.1)


async def test_direct_resend_and_client_strip(video_replica: VllmReplica, clips: Path) -> None:
    """Directly to vLLM a resending client sends every clip of the window every turn (W-ish times each);
    with --uuid-and-strip it sends each once and references the repeats. vLLM's cache hits either way
    (without uuids it hashes the decoded clip), so a repeat's cost there is the bytes and the decode."""
    resend = await bench(video_replica.url, clips, video_replica.url, "direct-")
    strip = await bench(video_replica.url, clips, video_replica.url, "strip-", uuid_and_strip=True)
    ratio = TURNS * WINDOW / CLIPS
    assert resend["totals"]["video_bytes_per_unique"] == pytest.approx(ratio, rel=0.05)
    assert resend["engine"]["video_bytes_est_per_unique"] == pytest.approx(ratio, rel=0.05)
    assert strip["totals"]["video_bytes_per_unique"] == 1.0
    assert strip["engine"]["video_bytes_est_per_unique"] == 1.0
    assert strip["totals"]["stripped_refs"] == REPEATS
    assert_a_hit_on_each_repeat(resend)
    assert_a_hit_on_each_repeat(strip)


async def test_clips_from_the_bench_origin(video_replica: VllmReplica, tmp_path: Path) -> None:
    """``--image-mode origin``: the bench's own origin serves the clips as http URLs and vLLM fetches
    them; stripped, each clip is fetched once and every repeat is a cache hit."""
    spec = SlidingWindowSpec(sessions=1, turns=TURNS, window=WINDOW, image_size=64, media="video", seed=6)
    dataset = generate_sliding_window(spec, tmp_path).path
    summary = await bench(video_replica.url, dataset, video_replica.url, "origin-", uuid_and_strip=True,
                          image_mode="origin")
    assert summary["origin"]["requests"] == CLIPS
    assert_a_hit_on_each_repeat(summary)
