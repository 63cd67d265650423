"""The benchmark through a real mmgate gateway (embedded sim engines behind it) on loopback."""

from __future__ import annotations

from pathlib import Path

from mmgate.bench.dataset import load_dataset
from mmgate.bench.runner import run_benchmark
from mmgate.bench.settings import BenchSettings
from tests.bench.test_run_sim import quiet
from tests.support.gateway import running_gateway


async def test_strip_through_the_gateway_halves_image_uploads(sliding_window: Path) -> None:
    sessions = load_dataset(sliding_window, "single_turn")
    async with running_gateway() as gw:
        results = {}
        for strip in (False, True):
            settings = BenchSettings(url=gw.url, dataset=str(sliding_window), concurrency=3,
                                     uuid_and_strip=strip, session_prefix=f"strip{int(strip)}-")
            results[strip] = (await run_benchmark(settings, sessions, None, console=quiet(), plots=False)).summary
    plain, strip_on = results[False]["totals"], results[True]["totals"]
    assert plain["errors"] == 0 and strip_on["errors"] == 0
    assert plain["logical_images"] == strip_on["logical_images"] == 36
    assert (plain["images_with_data"], strip_on["images_with_data"]) == (36, 18)
    assert strip_on["image_bytes_sent"] < 0.6 * plain["image_bytes_sent"]


async def test_origin_mode_through_the_gateway_fetches_each_image_once(sliding_window: Path) -> None:
    sessions = load_dataset(sliding_window, "single_turn")
    async with running_gateway() as gw:
        settings = BenchSettings(url=gw.url, dataset=str(sliding_window), concurrency=3, image_mode="origin")
        summary = (await run_benchmark(settings, sessions, None, console=quiet(), plots=False)).summary
    assert summary["totals"]["errors"] == 0
    assert summary["totals"]["logical_images"] == 36
    # 18 distinct screenshots, each referenced by URL up to 3 times: the gateway's URL cache
    # downloads each from the origin once.
    assert summary["origin"]["requests"] == 18
