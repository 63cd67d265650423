"""Video reuse against real vLLM (its CPU build, the tiny Qwen2-VL, whose chat template has the video
placeholder): a video sent with a uuid is processed once; its repeat goes as a reference and its
uuid-only reference too, each a processor-cache hit in vLLM's own metrics; a replica restarted with
an empty cache misses the reference and the gateway heals it with the URL it checked; a uuid the
gateway never saw is a 400 naming the part.

Its own replica (the session's two serve no video: ``--limit-mm-per-prompt`` allows images only),
with a gateway in front, for the module.
"""

from __future__ import annotations

import asyncio
import base64
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import VLLM_TEST_TIMEOUT_S
from tests.support.gateway import gateway_settings, running_gateway, vllm_specs
from tests.support.recorder import recording_proxy
from tests.support.vllm import GatewayProcess, VllmReplica, running_gateway_process, running_replicas
from tests.vllm.conftest import GATEWAY_FLAGS
from tests.vllm.helpers import body, chat
from tests.vllm.test_heal import _until_healthy

# Its own replica starts (and restarts) inside the test's time, as the session's do for theirs.
pytestmark = pytest.mark.timeout(VLLM_TEST_TIMEOUT_S)

# Eight 64x64 frames of noise at 4 fps, written by OpenCV (vLLM's video loader) in the vLLM venv.
_MAKE_CLIP = """
import sys, cv2, numpy as np
w = cv2.VideoWriter(sys.argv[1], cv2.VideoWriter_fourcc(*"mp4v"), 4, (64, 64))
rng = np.random.default_rng(int(sys.argv[2]))
for _ in range(8):
    w.write(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8))
w.release()
"""


@pytest.fixture(scope="module")
def video_replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmReplica]:
    extra = ("--limit-mm-per-prompt", '{"image": 8, "video": 2}')
    with running_replicas(1, tmp_path_factory.mktemp("vllm-video"), extra_args=extra) as (replica,):
        yield replica


@pytest.fixture(scope="module")
def video_gateway(video_replica: VllmReplica, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    log = tmp_path_factory.mktemp("gateway-video") / "mmgate.log"
    with running_gateway_process([video_replica.url], log, *GATEWAY_FLAGS) as gw:
        yield gw


def make_clip(replica: VllmReplica, directory: Path, seed: int) -> str:
    path = directory / f"clip-{seed}.mp4"
    subprocess.run([str(replica.setup.python), "-c", _MAKE_CLIP, str(path), str(seed)], check=True, timeout=60)
    return "data:video/mp4;base64," + base64.b64encode(path.read_bytes()).decode()


@pytest.fixture(scope="module")
def clip(video_replica: VllmReplica, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_clip(video_replica, tmp_path_factory.mktemp("clip"), 7)


def video(url: str | None, uuid: str) -> dict[str, Any]:
    return {"type": "video_url", "video_url": {"url": url} if url is not None else None, "uuid": uuid}


async def test_a_video_is_processed_once_per_replica_and_its_misses_heal(
    video_gateway: GatewayProcess, video_replica: VllmReplica, clip: str,
) -> None:
    headers = {"x-session-id": "s-video"}
    first = await chat(video_gateway.url, body(video(clip, "clip-1"), text="What happens?"), headers)
    assert first.status == 200, first.json
    tokens = first.json["usage"]["prompt_tokens"]

    for turn in (video(clip, "clip-1"), video(None, "clip-1")):  # a repeat, then a uuid-only reference
        queries, hits = video_replica.cache_counters()
        again = await chat(video_gateway.url, body(turn, text="What happens?"), headers)
        assert again.status == 200, again.json
        assert again.json["usage"]["prompt_tokens"] == tokens
        assert video_replica.cache_counters() == (queries + 1, hits + 1)  # a processor-cache hit

    # A fresh process on the same port: its cache is empty; vLLM's real 400 for the reference is
    # healed with the URL the gateway checked for clip-1.
    await asyncio.to_thread(video_replica.restart)
    await _until_healthy(video_gateway, "vllm-0", True)
    healed = await chat(video_gateway.url, body(video(None, "clip-1"), text="What happens?"), headers)
    assert healed.status == 200, healed.json
    assert healed.json["usage"]["prompt_tokens"] == tokens

    unknown = await chat(video_gateway.url, body(video(None, "never-sent"), text="What happens?"), headers)
    assert unknown.status == 400, unknown.json
    assert "never-sent" in unknown.message and unknown.json["error"]["param"] == "messages[0].content[1]"


async def test_a_data_video_sent_without_a_uuid_is_reused_by_its_content(
    video_replica: VllmReplica, tmp_path: Path,
) -> None:
    """The gateway keys a checked data: video by its content, as it keys an image: the repeat goes to
    vLLM as a reference (seen by a recording proxy in front of it), a processor-cache hit."""
    url = make_clip(video_replica, tmp_path, 11)
    unlabelled = {"type": "video_url", "video_url": {"url": url}}
    headers = {"x-session-id": "s-video-content"}
    async with recording_proxy(video_replica.url) as rec, \
            running_gateway(gateway_settings(backends=vllm_specs([rec]))) as gw:
        first = await chat(gw.url, body(unlabelled, text="What happens?"), headers)
        assert first.status == 200, first.json
        queries, hits = video_replica.cache_counters()
        again = await chat(gw.url, body(unlabelled, text="What happens?"), headers)
        assert again.status == 200, again.json
        assert video_replica.cache_counters() == (queries + 1, hits + 1)
    sent = [b["messages"][0]["content"][1] for b in rec.bodies]
    assert sent[0]["video_url"] == {"url": url} and sent[0]["uuid"].startswith("~sha256:")
    assert sent[1] == {"type": "video_url", "video_url": None, "uuid": sent[0]["uuid"]}
