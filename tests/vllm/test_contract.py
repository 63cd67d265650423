"""The gateway → vLLM contract (docs/ARCHITECTURE.md) against real vLLM: every shape the gateway sends is accepted,
and a cache-only reference is a real processor-cache hit (``vllm:mm_cache_hits_total`` moves)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.images import make_image
from tests.support.origin import ImageOrigin
from tests.support.recorder import recording_proxy
from tests.support.vllm import GatewayProcess, VllmReplica, running_gateway_process
from tests.vllm.conftest import GATEWAY_FLAGS
from tests.vllm.helpers import Answer, body, chat, fresh_jpeg, image, replica_for


async def _seed(gateway: GatewayProcess, session: str, uuid: str | None) -> tuple[str, dict[str, str], Answer]:
    """A first turn with a new image: (its data URL, the session headers, the answer)."""
    headers = {"x-session-id": session}
    url = fresh_jpeg()
    first = await chat(gateway.url, body(image(url, uuid)), headers)
    assert first.status == 200, first.json
    assert first.reuse()["sent"] == 1
    return url, headers, first


@pytest.mark.parametrize(
    "reference",
    [
        {"type": "image_url", "image_url": None},
        {"type": "image_url", "image_url": {}},
        {"type": "image_url", "image_url": {"url": ""}},
        {"type": "image_url"},
    ],
    ids=["null", "empty-object", "empty-url", "no-image_url"],
)
async def test_cache_only_reference_is_a_real_processor_cache_hit(
    gateway: GatewayProcess, vllm_replicas: list[VllmReplica], reference: dict[str, Any], request: pytest.FixtureRequest
) -> None:
    uuid = f"ref-{request.node.callspec.id}"
    _, headers, first = await _seed(gateway, f"s-{uuid}", uuid)
    replica = replica_for(first, vllm_replicas)
    queries, hits = replica.cache_counters()

    second = await chat(gateway.url, body({**reference, "uuid": uuid}), headers)

    assert second.status == 200, second.json
    assert replica_for(second, vllm_replicas) is replica
    assert second.reuse() == {"sent": 0, "stripped": 0, "referenced": 1, "healed": 0}
    assert replica.cache_counters() == (queries + 1, hits + 1)
    assert second.json["usage"]["prompt_tokens"] == first.json["usage"]["prompt_tokens"]


async def test_resent_image_goes_as_reference_and_hits(gateway: GatewayProcess, vllm_replicas: list[VllmReplica]) -> None:
    """An unmodified client resends an unlabelled image: the gateway sends vLLM a reference by its
    content uuid, and vLLM's processor cache hits."""
    url, headers, first = await _seed(gateway, "s-resend", uuid=None)
    replica = replica_for(first, vllm_replicas)
    queries, hits = replica.cache_counters()

    again = await chat(gateway.url, body(image(url)), headers)

    assert again.status == 200, again.json
    assert again.reuse() == {"sent": 0, "stripped": 1, "referenced": 0, "healed": 0}
    assert replica.cache_counters() == (queries + 1, hits + 1)


async def test_deprecated_nested_uuid_then_reference(gateway: GatewayProcess, vllm_replicas: list[VllmReplica]) -> None:
    headers = {"x-session-id": "s-nested"}
    first = await chat(gateway.url, body({"type": "image_url", "image_url": {"url": fresh_jpeg(), "uuid": "nested-1"}}),
                       headers)
    assert first.status == 200, first.json
    replica = replica_for(first, vllm_replicas)
    queries, hits = replica.cache_counters()
    second = await chat(gateway.url, body(image(None, "nested-1")), headers)
    assert second.status == 200, second.json
    assert replica.cache_counters() == (queries + 1, hits + 1)


async def test_mixed_request_sends_new_images_and_references_old_ones(
    gateway: GatewayProcess, vllm_replicas: list[VllmReplica]
) -> None:
    headers = {"x-session-id": "s-mixed"}
    old = [fresh_jpeg(), fresh_jpeg()]
    first = await chat(gateway.url, body(image(old[0], "m-0"), image(old[1])), headers)
    assert first.status == 200, first.json
    replica = replica_for(first, vllm_replicas)
    queries, hits = replica.cache_counters()

    turn = await chat(gateway.url, body(image(None, "m-0"), image(old[1]), image(fresh_jpeg(), "m-2")), headers)

    assert turn.status == 200, turn.json
    assert turn.reuse() == {"sent": 1, "stripped": 1, "referenced": 1, "healed": 0}
    assert replica.cache_counters() == (queries + 3, hits + 2)


async def test_what_vllm_receives_is_the_contract(vllm_replicas: list[VllmReplica], tmp_path: Any) -> None:
    """Through a recording proxy: URL-backed slots arrive as data: URLs with a uuid (vLLM never
    sees the origin), repeats as ``image_url: null`` with the same uuid; real vLLM answers 200."""
    origin = await ImageOrigin().start()
    try:
        jpeg = make_image("JPEG", 224, 224, seed=77, noise=0.5)
        origin_url = origin.add("cat.jpg", jpeg, "image/jpeg")
        async with recording_proxy(vllm_replicas[0].url) as rec:
            with running_gateway_process([rec.url], tmp_path / "gw.log", *GATEWAY_FLAGS) as gw:
                headers = {"x-session-id": "s-wire"}
                first = await chat(gw.url, body(image(origin_url, "client-1"), image(fresh_jpeg())), headers)
                second = await chat(gw.url, body(image(origin_url, "client-1"), image(None, "client-1")), headers)
        assert (first.status, second.status) == (200, 200), (first.json, second.json)
        sent_url, sent_data = rec.image_parts(0)
        assert sent_url["uuid"] == "client-1"
        assert sent_url["image_url"]["url"].startswith("data:image/jpeg;base64,")
        assert set(sent_url) == {"type", "image_url", "uuid"}
        assert len(sent_data["uuid"]) >= 32 and sent_data["uuid"] != "client-1"  # a content uuid
        assert rec.image_parts(1) == [
            {"type": "image_url", "image_url": None, "uuid": "client-1"},
            {"type": "image_url", "image_url": None, "uuid": "client-1"},
        ]
        assert origin.hits["/img/cat.jpg"] == 1
    finally:
        await origin.stop()


async def test_openai_kind_backend_never_sees_a_uuid(vllm_replicas: list[VllmReplica], tmp_path: Any) -> None:
    """vLLM behind ``--backend openai=``: cache-only references are resolved to bytes."""
    async with recording_proxy(vllm_replicas[1].url) as rec:
        with running_gateway_process([], tmp_path / "gw.log", "--backend", f"openai={rec.url}", *GATEWAY_FLAGS) as gw:
            headers = {"x-session-id": "s-openai"}
            first = await chat(gw.url, body(image(fresh_jpeg(), "o-1")), headers)
            second = await chat(gw.url, body(image(None, "o-1")), headers)
    assert (first.status, second.status) == (200, 200), (first.json, second.json)
    for index in (0, 1):
        (part,) = rec.image_parts(index)
        assert "uuid" not in part and part["image_url"]["url"].startswith("data:image/jpeg;base64,")
    assert rec.image_parts(0) == rec.image_parts(1)
