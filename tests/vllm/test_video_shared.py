"""Video reuse on the shared tier, against real vLLM (the tiny Qwen2-VL, video allowed) and a real
redis-server: the checked URL of a video sent with a uuid is written to Redis, so a gateway that never
saw the video — here a fresh one, as after a restart — heals vLLM's miss of a uuid-only reference with
it. A gateway without the shared tier cannot: the client's 400 names the part."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from typing import Any

import pytest

from mmgate.bench.videos import make_clip
from tests.conftest import VLLM_TEST_TIMEOUT_S
from tests.support.gateway import gateway_settings, running_gateway, vllm_specs
from tests.support.redis_servers import RedisServer
from tests.support.vllm import VllmReplica, running_replicas
from tests.vllm.helpers import body, chat

pytestmark = pytest.mark.timeout(VLLM_TEST_TIMEOUT_S)


@pytest.fixture(scope="module")
def video_replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmReplica]:
    extra = ("--limit-mm-per-prompt", '{"image": 1, "video": 1}')
    with running_replicas(1, tmp_path_factory.mktemp("vllm-video-shared"), extra_args=extra) as (replica,):
        yield replica


def video(url: str | None, uuid: str) -> dict[str, Any]:
    return {"type": "video_url", "video_url": {"url": url} if url is not None else None, "uuid": uuid}


async def test_a_fresh_gateway_heals_a_video_reference_from_the_shared_tier(
    video_replica: VllmReplica, standalone_server: RedisServer,
) -> None:
    clip = "data:video/mp4;base64," + base64.b64encode(make_clip(64, 8, 4, "shared")).decode()
    shared = {"redis_url": standalone_server.url}
    specs = vllm_specs([video_replica])
    async with running_gateway(gateway_settings(backends=specs, cache=shared)) as first:
        sent = await chat(first.url, body(video(clip, "rec-1"), text="What happens?"))
        assert sent.status == 200, sent.json
        for _ in range(100):  # the shared write runs in the background: wait for it (bounded)
            if standalone_server.client().keys("*video-url:*"):
                break
            await asyncio.sleep(0.02)
    tokens = sent.json["usage"]["prompt_tokens"]
    await asyncio.to_thread(video_replica.restart)  # vLLM's processor cache is empty now

    reference = body(video(None, "rec-1"), text="What happens?")
    async with running_gateway(gateway_settings(backends=specs)) as alone:  # no shared tier
        refused = await chat(alone.url, reference)
    assert refused.status == 400 and "rec-1" in refused.message, refused.json
    assert refused.json["error"]["param"] == "messages[0].content[1]"

    async with running_gateway(gateway_settings(backends=specs, cache=shared)) as fresh:
        queries, hits = video_replica.cache_counters()
        healed = await chat(fresh.url, reference)
        assert healed.status == 200, healed.json
        assert healed.json["usage"]["prompt_tokens"] == tokens
        # vLLM missed the reference, then processed the clip the shared tier gave back.
        assert video_replica.cache_counters()[1] == hits and video_replica.cache_counters()[0] > queries
