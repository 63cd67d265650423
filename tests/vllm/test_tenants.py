"""Tenants against real vLLM: two tenants choosing the same uuid never share an image in vLLM's
processor cache, vLLM never sees a client's uuid verbatim, and a stored response is its tenant's."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from mmgate.api.anthropic.handlers import tenant_marked
from mmgate.reuse import KeySpace
from tests.support.agents import call
from tests.support.recorder import recording_proxy
from tests.support.vllm import SERVED_MODEL, VllmReplica, running_gateway_process
from tests.vllm.conftest import GATEWAY_FLAGS
from tests.vllm.helpers import body, chat, fresh_jpeg, image


async def test_same_uuid_two_tenants_two_cache_entries(vllm_replicas: list[VllmReplica], tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("key-a tenant-a\nkey-b tenant-b\n")
    replica = vllm_replicas[0]
    a = {"Authorization": "Bearer key-a", "x-session-id": "s-tenant-a"}
    b = {"Authorization": "Bearer key-b", "x-session-id": "s-tenant-b"}
    async with recording_proxy(replica.url) as rec:
        with running_gateway_process([rec.url], tmp_path / "gw.log", "--api-keys-file", str(keys),
                                     *GATEWAY_FLAGS) as gw:
            seeded = await chat(gw.url, body(image(fresh_jpeg(), "shared")), a)
            queries, hits = replica.cache_counters()
            # Tenant B names A's uuid without bytes: nobody holds B's "shared".
            stolen = await chat(gw.url, body(image(None, "shared")), b)
            after_stolen = replica.cache_counters()
            own = await chat(gw.url, body(image(fresh_jpeg(), "shared")), b)
            after_own = replica.cache_counters()
            mine = await chat(gw.url, body(image(None, "shared")), a)
            after_mine = replica.cache_counters()
    assert seeded.status == 200, seeded.json
    assert stolen.status == 400 and "shared" in stolen.message
    assert after_stolen == (queries, hits)  # vLLM missed (a miss is no query): no hit on A's image
    assert own.status == 200 and after_own == (after_stolen[0] + 1, hits)  # B's image is a miss: its own entry
    assert mine.status == 200 and after_mine == (after_own[0] + 1, hits + 1)  # A still hits its own
    sent_keys = [part["uuid"] for i in range(len(rec.bodies)) for part in rec.image_parts(i)]
    assert "shared" not in sent_keys
    # seeded (A), stolen (B's own key: vLLM's miss, then the gateway's 400), own (B), mine (A).
    assert len(sent_keys) == 4
    key_a, key_b = sent_keys[0], sent_keys[1]
    assert key_a != key_b
    assert sent_keys[2:] == [key_b, key_a]
    assert rec.image_parts(1) == [{"type": "image_url", "image_url": None, "uuid": key_b}]


async def test_a_stored_response_is_its_tenants(vllm_replicas: list[VllmReplica], tmp_path: Path) -> None:
    """vLLM names a response by the request_id the gateway mints for its tenant: the owner reaches it,
    another tenant gets the unknown-id 404 (the replicas store responses: VLLM_ENABLE_RESPONSES_API_STORE)."""
    keys = tmp_path / "keys.txt"
    keys.write_text("key-a tenant-a\nkey-b tenant-b\n")
    a, b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    with running_gateway_process([r.url for r in vllm_replicas], tmp_path / "gw.log", "--api-keys-file", str(keys),
                                 *GATEWAY_FLAGS) as gw:
        made = await call(gw.url, "/v1/responses", {"model": SERVED_MODEL, "input": "Hi", "max_output_tokens": 4,
                                                    "store": True}, headers=a)
        assert made.status == 200 and len(made.json["id"]) == 69, made.json  # resp_ + nonce + MAC
        mine = await call(gw.url, f"/v1/responses/{made.json['id']}", method="GET", headers=a)
        assert mine.status == 200 and mine.json["id"] == made.json["id"]
        theirs = await call(gw.url, f"/v1/responses/{made.json['id']}", method="GET", headers=b)
        assert theirs.status == 404 and theirs.json["error"]["code"] == "response_not_found"


async def test_a_tenant_marked_image_is_its_tenants_in_vllms_cache(vllm_replicas: list[VllmReplica]) -> None:
    """What the gateway does to an image in a Messages request it forwards to vLLM's own endpoint
    (which takes no uuid) for a tenant (``tenant_marked``), sent here straight to vLLM's
    /v1/messages: vLLM keys the image by its bytes, so tenant B's copy of A's image is a miss (B
    cannot time A's), A's repeat a hit, and the answer is the unmarked image's (the same pixels)."""
    raw = base64.b64decode(fresh_jpeg().split(",", 1)[1])
    keys = KeySpace()
    replica = vllm_replicas[0]

    def request(data: bytes) -> dict[str, Any]:
        return {"model": SERVED_MODEL, "max_tokens": 3, "temperature": 0, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is this?"}, {
                "type": "image", "source": {"type": "base64", "media_type": "image/jpeg",
                                            "data": base64.b64encode(data).decode()}}]}]}

    queries, hits = replica.cache_counters()
    answers = []
    for tenant in ("tenant-a", "tenant-a", "tenant-b"):
        reply = await call(replica.url, "/v1/messages", request(tenant_marked(raw, keys.tenant_tag(tenant))))
        assert reply.status == 200, reply.json
        answers.append(reply.json["content"])
    after_queries, after_hits = replica.cache_counters()
    assert (after_queries - queries, after_hits - hits) == (3, 1)
    plain = await call(replica.url, "/v1/messages", request(raw))
    assert plain.status == 200 and answers == [plain.json["content"]] * 3
