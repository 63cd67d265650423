"""A video session as the bench sends it: ``video_url`` parts, repeats stripped by ``--uuid-and-strip``,
video bytes sent against unique video bytes; and what it refuses before sending anything (the sim,
APIs that carry no video)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from mmgate.bench.client import ChatClient, ResponseResult
from mmgate.bench.compare import flatten
from mmgate.bench.dataset import load_dataset
from mmgate.bench.engine_metrics import EngineCounters, EngineMetrics, metrics_url, parse_counters
from mmgate.bench.errors import BenchError
from mmgate.bench.images import DatasetImages
from mmgate.bench.payload import BodyOptions, build_request
from mmgate.bench.planner import StripPlanner
from mmgate.bench.records import RecordStore, RequestRecord
from mmgate.bench.report import engine_summary
from mmgate.bench.runner import run_benchmark
from mmgate.bench.settings import BenchSettings
from mmgate.bench.synth import SlidingWindowSpec, generate_sliding_window
from tests.bench.conftest import Recorder
from tests.bench.test_run_sim import quiet
from tests.support.apps import serving
from tests.support.gateway import running_gateway


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1 session x 4 turns, a window of 3 clips, one new per turn."""
    spec = SlidingWindowSpec(sessions=1, turns=4, window=3, image_size=32, media="video")
    return generate_sliding_window(spec, tmp_path_factory.mktemp("clips")).path


async def _play(dataset: Path, strip: bool) -> RecordStore:
    """The session's requests as the load engine builds them, every one answered 200."""
    (session,) = load_dataset(dataset, "single_turn")
    resolver, planner = DatasetImages("data", 1 << 20), StripPlanner(strip)
    store = RecordStore(0)
    ok = ResponseResult(200, None, 0, 1, 2, 1, 1)
    for i, turn in enumerate(session.turns):
        built = await build_request(BodyOptions("m"), resolver, planner, None, [], turn)
        planner.commit(built.plan)
        parts = [p for p in orjson.loads(built.body)["messages"][0]["content"] if p["type"] != "text"]
        assert [p["type"] for p in parts] == ["video_url"] * 3
        with_data = [p for p in parts if p["video_url"] is not None]
        assert all(p["video_url"]["url"].startswith("data:video/mp4;base64,") for p in with_data)
        if strip and i:  # only the new clip travels; the two repeats are references by content uuid
            assert len(with_data) == 1 and all(len(p["uuid"]) == 64 for p in parts)
        store.add(RequestRecord("s", i, 0, ok, built.counts, len(built.body)))
    return store


async def test_video_bytes_sent_against_unique_bytes(clips: Path) -> None:
    resend, strip = await _play(clips, False), await _play(clips, True)
    r, s = resend.totals, strip.totals
    assert (r.logical_videos, r.videos_with_data, r.logical_images) == (12, 12, 0)
    assert (s.logical_videos, s.videos_with_data, s.stripped_refs) == (12, 6, 6)
    assert r.unique_videos == s.unique_videos == 6 and r.unique_video_bytes == s.unique_video_bytes
    assert s.video_bytes_sent == s.unique_video_bytes  # each clip once
    assert r.video_bytes_sent / r.unique_video_bytes == pytest.approx(2.0, rel=0.1)  # 12 sends of 6 clips
    engine = engine_summary(EngineCounters(12, 6, s.body_bytes), strip)
    assert engine["video_bytes_est_per_unique"] == 1.0  # the engine got what the client sent


PAGE = """# HELP vllm:mm_cache_queries_total x
vllm:mm_cache_queries_total{engine="0",model_name="m"} 12.0
vllm:mm_cache_hits_total{engine="0",model_name="m"} 6.0
http_request_size_bytes_sum{handler="/v1/chat/completions"} 1000.0
http_request_size_bytes_sum{handler="/v1/models"} 0.0
http_request_size_bytes_count{handler="/v1/models"} 3.0
"""


def test_engine_counters_from_a_prometheus_page() -> None:
    page = PAGE
    assert parse_counters(page) == EngineCounters(12, 6, 1000)
    assert parse_counters("") == EngineCounters()
    assert metrics_url("http://h:1/") == "http://h:1/metrics" == metrics_url("http://h:1/metrics")
    with pytest.raises(BenchError, match="--engine-metrics"):
        metrics_url("h:1")


@pytest.fixture
async def chunked_metrics() -> AsyncIterator[str]:
    """A real HTTP server whose /metrics page comes in two writes, its counters in the second (as a
    real engine's long page does); /big/metrics serves a page over the reader's cap."""
    async def metrics(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        await resp.write(b"# HELP padding\n" * 1000)
        await asyncio.sleep(0.05)
        await resp.write(PAGE.encode())
        await resp.write_eof()
        return resp

    async def big(request: web.Request) -> web.Response:
        return web.Response(body=b"#" * (9 << 20))

    async def refuse(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=400, headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await resp.write(b'{"error": {"message": "' + b"x" * 2000)
        await asyncio.sleep(0.05)
        await resp.write(b' the end", "type": "BadRequestError"}}')
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/chat/completions", refuse)
    app.router.add_get("/big/metrics", big)
    async with serving(app) as url:
        yield url


async def test_engine_counters_read_the_whole_page(chunked_metrics: str) -> None:
    """The counters after the first chunk are read too (a first-chunk read saw none of them, and a
    benchmark's before-read of 0 bytes counted every earlier run's bytes as its own)."""
    async with EngineMetrics([chunked_metrics]) as probe:
        assert await probe.read() == EngineCounters(12, 6, 1000)
    async with EngineMetrics([chunked_metrics + "/big"]) as probe:
        with pytest.raises(BenchError, match="over"):
            await probe.read()


async def test_an_error_body_is_read_whole(chunked_metrics: str) -> None:
    """A backend's error that comes in two chunks is reported with its whole message."""
    async with ChatClient(chunked_metrics) as client:
        result = await client.chat(b"{}", session_id=None, stream=True)
    assert result.status == 400 and result.error is not None and result.error.endswith(" the end")


async def test_video_against_the_sim_is_refused_before_sending(clips: Path, recorder: Recorder) -> None:
    """The sim answers a video part 400 (it models image processing only): the bench says so at once."""
    settings = BenchSettings(url=recorder.url, dataset=str(clips))
    with pytest.raises(BenchError, match="sim engine, which takes no video parts"):
        await run_benchmark(settings, load_dataset(clips, "single_turn"), None, console=quiet(), plots=False)
    assert recorder.seen == []  # no request was sent


async def test_video_through_a_gateway_to_the_sim_is_refused_too(clips: Path) -> None:
    async with running_gateway() as gw:
        settings = BenchSettings(url=gw.url, dataset=str(clips))
        with pytest.raises(BenchError, match="sim engine"):
            await run_benchmark(settings, load_dataset(clips, "single_turn"), None, console=quiet(), plots=False)


@pytest.mark.parametrize("api", ["responses", "messages"])
async def test_video_needs_the_chat_api(clips: Path, api: str) -> None:
    settings = BenchSettings(url="http://127.0.0.1:9", dataset=str(clips), api=api)
    with pytest.raises(BenchError, match="take no video parts; use --api chat"):
        await run_benchmark(settings, load_dataset(clips, "single_turn"), None, console=quiet(), plots=False)


def test_compare_reads_the_engine_counters() -> None:
    summary = {"metrics": {}, "totals": {"video_bytes_per_unique": 1.0, "unique_video_bytes": None},
               "engine": {"cache_hits": 84, "video_bytes_est": None, "by_turn": []}}
    flat = flatten(summary)
    assert flat["engine.cache_hits"] == 84.0 and flat["video_bytes_per_unique"] == 1.0
    assert "engine.video_bytes_est" not in flat and "unique_video_bytes" not in flat
