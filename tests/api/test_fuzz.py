"""Fuzz the gateway with garbage: random mutations of a valid multimodal request and raw junk bytes,
sent for real over loopback. Mutations draw on every part shape vLLM's chat parser acts on (media
keys and part types, uuids on any part). Every answer must be a 2xx or an OpenAI-style 4xx — never a
5xx, never a crash — every part that reaches the backend is in the gateway's canonical form, and
afterwards the gateway still serves the valid request with the right image."""

from __future__ import annotations

import random
from typing import Any

import aiohttp
import orjson

from tests.support.fuzz import mutate
from tests.support.gateway import gateway_settings, running_gateway, running_sims, vllm_specs
from tests.support.images import png_data_url
from tests.support.recorder import recording_proxy

MODEL = "mmgate-sim-vl"
SEED = 20261129


def valid_request(all_shapes: bool = True) -> dict[str, Any]:
    """A request the gateway answers 200; ``all_shapes=False``: only the shapes the sim reads."""
    body = {
        "model": MODEL,
        "max_tokens": 4,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": png_data_url(1, 40, 30)}, "uuid": "fz-1"},
                {"type": "image_url", "image_url": None, "uuid": "fz-1"},
                {"type": "input_image", "image_url": png_data_url(2, 40, 30), "detail": "auto"},
                {"image_url": {"url": png_data_url(3, 40, 30)}, "uuid": "fz-3"},
            ]},
        ],
    }
    if not all_shapes:
        del body["messages"][1]["content"][3:]  # type: ignore[index]
    return body


TEXT_TYPES = {"text", "input_text", "output_text", "refusal", "thinking", "tool_reference"}
MEDIA = {"image_url", "input_image", "image_pil", "image_embeds", "audio_embeds", "video_embeds", "prompt_embeds",
         "audio_url", "input_audio", "video_url"}


def assert_canonical(body: dict[str, Any]) -> None:
    """Every content part the backend got is one the gateway built: a text part with no uuid and no
    media key, or an image_url part with a data: URL or none, and a uuid."""
    for message in body["messages"]:
        for part in message.get("content") if isinstance(message.get("content"), list) else []:
            if isinstance(part, str):
                continue
            if part.get("type") in TEXT_TYPES:
                assert "uuid" not in part and not (MEDIA & set(part)), part
                continue
            assert part["type"] == "image_url" and set(part) == {"type", "image_url", "uuid"}, part
            assert isinstance(part["uuid"], str) and part["uuid"]
            url = (part["image_url"] or {}).get("url")
            assert url is None or url.startswith("data:image/"), part


async def test_mutated_requests_and_junk_never_5xx_and_poison_nothing() -> None:
    rng = random.Random(SEED)
    async with running_sims(1) as sims, recording_proxy(sims[0].url) as rec:
        async with running_gateway(gateway_settings(backends=vllm_specs([rec]))) as gw, aiohttp.ClientSession() as s:
            url = gw.url + "/v1/chat/completions"
            statuses: dict[int, int] = {}
            bodies = [mutate(rng, valid_request()) for _ in range(1500)]
            bodies += [rng.randbytes(rng.randint(0, 2000)) for _ in range(50)]
            bodies += [b"\xff\xfe{", b"[]", b"null", b'{"model": "mmgate-sim-vl", "messages": {}}']
            for raw in bodies:
                async with s.post(url, data=raw, headers={"Content-Type": "application/json"}) as r:
                    text = await r.read()
                    statuses[r.status] = statuses.get(r.status, 0) + 1
                    assert r.status < 500, (r.status, raw[:200], text[:300])
                    if r.status >= 400:
                        err = orjson.loads(text)["error"]
                        assert err["message"] and err["type"]
            assert statuses.get(400, 0) > 500  # the garbage really was garbage
            for sent in rec.bodies:
                assert_canonical(sent)
            # Still alive, and the valid request still sends the right bytes for fz-1.
            async with s.post(url, json=valid_request()) as r:
                assert r.status == 200, await r.text()
            # Garbage sent under uuid fz-1 never replaced the validated image the gateway holds.
            stored = gw.gateway.store.peek("fz-1")
            assert stored is not None and stored.data_url() == png_data_url(1, 40, 30)
            async with s.post(url, json={"model": MODEL, "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": None, "uuid": "fz-1"}]}]}) as r:
                assert r.status == 200


async def test_the_embedded_engine_survives_the_same_garbage() -> None:
    rng = random.Random(SEED + 1)
    async with running_sims(1) as sims, aiohttp.ClientSession() as s:
        url = sims[0].url + "/v1/chat/completions"
        first = valid_request(all_shapes=False)
        del first["messages"][1]["content"][2]  # the reference to fz-1: the engine sees fz-1 first
        async with s.post(url, json=first) as r:
            assert r.status == 200
        for raw in [mutate(rng, valid_request()) for _ in range(800)] + [rng.randbytes(rng.randint(0, 500)) for _ in range(50)]:
            async with s.post(url, data=raw, headers={"Content-Type": "application/json"}) as r:
                assert r.status < 500, (r.status, raw[:200], (await r.read())[:300])
        async with s.post(url, json=valid_request(all_shapes=False)) as r:
            assert r.status == 200
