"""End to end over loopback: the benchmark drives the sim through a recording endpoint.

The assertions read the request bodies the recorder received — what was actually sent.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from rich.console import Console

from mmgate.app_runtime import json_response
from mmgate.bench.dataset import load_dataset
from mmgate.bench.runner import run_benchmark
from mmgate.bench.settings import BenchSettings
from mmgate.sim.server import SimServer
from tests.bench.conftest import Recorder, write_jsonl


def quiet() -> Console:
    return Console(file=open("/dev/null", "w"), width=120)


def settings(url: str, dataset: Path, **kw: Any) -> BenchSettings:
    return BenchSettings(url=url, dataset=str(dataset), **kw)


def data_bytes(part: dict[str, Any]) -> bytes:
    return base64.b64decode(part["image_url"]["url"].partition(",")[2])


async def test_single_turn_strip_sends_only_new_images(recorder: Recorder, sim: SimServer,
                                                       sliding_window: Path, tmp_path: Path) -> None:
    sessions = load_dataset(sliding_window, "single_turn")
    out = await run_benchmark(settings(recorder.url, sliding_window, concurrency=3, uuid_and_strip=True),
                              sessions, tmp_path / "strip", console=quiet(), plots=False)
    by_session = recorder.by_session()
    assert sorted(by_session) == ["sw-0000", "sw-0001", "sw-0002"]
    for sid, requests in by_session.items():
        assert len(requests) == 4
        for turn, seen in enumerate(requests):
            parts = seen.images
            assert len(parts) == 3
            with_data = [p for p in parts if p["image_url"] is not None]
            refs = [p for p in parts if p["image_url"] is None]
            if turn == 0:
                assert len(with_data) == 3 and not refs
            else:
                # Only the newest screenshot travels; the two it shares with the last turn are references.
                assert parts[:2] == refs and parts[2] == with_data[0]
            for p in with_data:
                assert p["uuid"] == hashlib.sha256(data_bytes(p)).hexdigest()
            if turn:
                previous = {p["uuid"] for p in requests[turn - 1].images}
                assert {p["uuid"] for p in refs} <= previous
        assert all(s.status == 200 for s in requests), sid
    totals = out.summary["totals"]
    assert (totals["requests"], totals["errors"]) == (12, 0)
    assert (totals["logical_images"], totals["images_with_data"], totals["stripped_refs"]) == (36, 18, 18)
    assert sim.stats.cache_hits >= 18


async def test_without_strip_images_travel_every_turn_without_uuid(recorder: Recorder, sliding_window: Path,
                                                                   tmp_path: Path) -> None:
    sessions = load_dataset(sliding_window, "single_turn")
    out = await run_benchmark(settings(recorder.url, sliding_window, concurrency=2, stream=False),
                              sessions, tmp_path / "plain", console=quiet(), plots=False)
    assert len(recorder.seen) == 12
    for seen in recorder.seen:
        assert seen.body["stream"] is False
        assert all(p["image_url"]["url"].startswith("data:image/jpeg;base64,") and "uuid" not in p
                   for p in seen.images)
    assert out.summary["totals"]["images_with_data"] == 36
    assert out.summary["metrics"]["ttft_ms"] is None  # no TTFT without streaming


async def test_multi_turn_history_threads_replies_and_strips_whole_history(
    recorder: Recorder, sliding_window: Path, tmp_path: Path
) -> None:
    images = sorted((sliding_window.parent / "images").glob("s0000_*.jpg"))
    path = write_jsonl(tmp_path / "conv.jsonl", [{"session_id": "c1", "turns": [
        {"role": "system", "text": "be brief"},
        {"text": "first", "images": [str(images[0]), str(images[1])], "image_uuids": ["pic-0", None]},
        {"text": "second", "images": [str(images[2])]},
        {"text": "third", "images": [str(images[0])], "image_uuids": ["pic-0"]},
    ]}])
    out = await run_benchmark(settings(recorder.url, path, dataset_type="multi_turn", uuid_and_strip=True),
                              load_dataset(path, "multi_turn"), None, console=quiet(), plots=False)
    assert out.summary["totals"]["errors"] == 0
    r1, r2, r3 = recorder.seen
    assert [m["role"] for m in r3.body["messages"]] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert r3.body["messages"][0]["content"] == "be brief"
    # The assistant messages are the replies the server streamed for the earlier turns.
    assert r2.body["messages"][2]["content"] and r2.body["messages"][2] == r3.body["messages"][2]
    assert [p["image_url"] is None for p in r1.images] == [False, False]
    assert r1.images[0]["uuid"] == "pic-0"
    assert [p["image_url"] is None for p in r2.images] == [True, True, False]
    assert [p["image_url"] is None for p in r3.images] == [True, True, True, True]
    assert r3.images[3] == {"type": "image_url", "image_url": None, "uuid": "pic-0"}
    assert [p["uuid"] for p in r3.images[:3]] == [p["uuid"] for p in r2.images]


async def test_authored_cache_only_reference_passes_through(recorder: Recorder, sliding_window: Path,
                                                            tmp_path: Path) -> None:
    image = next((sliding_window.parent / "images").glob("*.jpg"))
    path = write_jsonl(tmp_path / "refs.jsonl", [
        {"session_id": "a", "text": "see", "images": [str(image)], "image_uuids": ["authored-1"]},
        {"session_id": "a", "text": "again", "image_uuids": ["authored-1"]},
        {"session_id": "b", "text": "unknown", "images": [None], "image_uuids": ["never-sent"]},
    ])
    out = await run_benchmark(settings(recorder.url, path), load_dataset(path, "single_turn"), None,
                              console=quiet(), plots=False)
    sent = {(s.headers["x-session-id"], s.body["messages"][0]["content"][0]["text"]): s for s in recorder.seen}
    assert sent["a", "again"].images == [{"type": "image_url", "image_url": None, "uuid": "authored-1"}]
    assert sent["a", "again"].status == 200
    assert sent["b", "unknown"].images == [{"type": "image_url", "image_url": None, "uuid": "never-sent"}]
    assert sent["b", "unknown"].status == 400
    totals = out.summary["totals"]
    assert (totals["errors"], totals["cache_misses"], totals["logical_images"]) == (1, 1, 3)
    assert any("Cache miss" in m for m in out.summary["errors"])


async def test_server_errors_are_counted_not_fatal(recorder: Recorder, sliding_window: Path, tmp_path: Path) -> None:
    def fail_odd(index: int, body: dict[str, Any]) -> web.StreamResponse | None:
        if index % 2:
            return json_response({"error": {"message": "overloaded", "type": "x", "code": 503}}, status=503)
        return None

    recorder.answer = fail_odd
    sessions = load_dataset(sliding_window, "single_turn")
    out = await run_benchmark(settings(recorder.url, sliding_window, concurrency=2, uuid_and_strip=True),
                              sessions, tmp_path / "errors", console=quiet(), plots=False)
    totals = out.summary["totals"]
    assert (totals["requests"], totals["errors"]) == (12, 6)
    assert totals["error_rate"] == 0.5
    assert out.summary["errors"] == {"HTTP 503: overloaded": 6}
    rows = [orjson.loads(line) for line in (tmp_path / "errors" / "requests.jsonl").read_bytes().splitlines()]
    assert sum(1 for r in rows if r["error"]) == 6
    # After a failed turn the planner resends: no reference to an image the server never accepted.
    accepted: dict[str, set[str]] = {}
    for seen in recorder.seen:
        known = accepted.setdefault(seen.headers["x-session-id"], set())
        assert {p["uuid"] for p in seen.images if p["image_url"] is None} <= known
        if seen.status == 200:
            known.update(p["uuid"] for p in seen.images)


async def test_cache_miss_makes_the_session_resend(recorder: Recorder, sliding_window: Path, tmp_path: Path) -> None:
    def miss_third(index: int, body: dict[str, Any]) -> web.StreamResponse | None:
        if index == 2:
            message = "Cache miss for image at index 0 but data is not provided."
            return json_response({"error": {"message": message, "type": "BadRequestError", "code": 400}},
                                 status=400)
        return None

    recorder.answer = miss_third
    rows = [orjson.loads(x) for x in sliding_window.read_bytes().splitlines()]  # noqa: ASYNC240  (tiny file)
    for r in rows:
        r["images"] = [str(sliding_window.parent / i) for i in r["images"]]
    path = write_jsonl(tmp_path / "one.jsonl", [r for r in rows if r["session_id"] == "sw-0000"])
    out = await run_benchmark(settings(recorder.url, path, uuid_and_strip=True), load_dataset(path, "single_turn"),
                              None, console=quiet(), plots=False)
    assert out.summary["totals"]["cache_misses"] == 1
    with_data = [sum(p["image_url"] is not None for p in s.images) for s in recorder.seen]
    assert with_data == [3, 1, 1, 3]  # turn 3 missed: turn 4 sends its whole window again


async def test_turns_of_a_session_never_overlap_and_carry_the_session_header(
    recorder: Recorder, sliding_window: Path
) -> None:
    sessions = load_dataset(sliding_window, "single_turn")
    await run_benchmark(settings(recorder.url, sliding_window, concurrency=3, session_header="x-my-session",
                                 session_prefix="run7-"), sessions, None, console=quiet(), plots=False)
    by_header: dict[str, list[Any]] = {}
    for seen in recorder.seen:
        by_header.setdefault(seen.headers["x-my-session"], []).append(seen)
    assert sorted(by_header) == ["run7-sw-0000", "run7-sw-0001", "run7-sw-0002"]
    for requests in by_header.values():
        texts = [r.body["messages"][0]["content"][0]["text"] for r in requests]
        assert texts == [f"Turn {i} of 4: what changed in the newest screenshot?" for i in range(1, 5)]
        for earlier, later in itertools.pairwise(requests):
            assert earlier.end <= later.start


async def test_delay_and_timestamp_are_honoured(recorder: Recorder, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "paced.jsonl", [
        {"session_id": "a", "text": "a1"},
        {"session_id": "a", "text": "a2", "delay": 150},
        {"session_id": "b", "text": "b1", "timestamp": 200},
    ])
    await run_benchmark(settings(recorder.url, path, concurrency=2), load_dataset(path, "single_turn"), None,
                        console=quiet(), plots=False)
    seen = {s.body["messages"][0]["content"]: s for s in recorder.seen}
    assert seen["a2"].start - seen["a1"].end >= 0.14
    assert seen["b1"].start - seen["a1"].start >= 0.18
