"""Media parts outside plain ``image_url`` through a real gateway, as an attacker sends them: other
tenants' backend keys in ``input_image`` parts, URLs to a private "secret" origin in ``input_image``,
``video_url`` and ``audio_url`` parts, and client uuids that spell a content key. The backend is a
recording proxy in front of a sim engine (which, like vLLM, reads ``input_image`` and fetches
http(s) URLs itself)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.gateway import gateway_settings, running_gateway, running_sims, vllm_specs
from tests.support.http import post
from tests.support.images import png_data_url, solid_image
from tests.support.origin import ImageOrigin
from tests.support.recorder import Recorder, recording_proxy

MODEL = "mmgate-sim-vl"


def turn(*parts: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 2,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "look"}, *parts]}]}


def forwarded_uuids(rec: Recorder) -> list[str]:
    return [p["uuid"] for m in rec.bodies[-1]["messages"] if isinstance(m.get("content"), list)
            for p in m["content"] if isinstance(p, dict) and "uuid" in p]


async def test_a_tenant_cannot_use_another_tenants_backend_key_in_any_image_shape(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("key-a tenant-a\nkey-b tenant-b\n")
    a = {"Authorization": "Bearer key-a"}
    b = {"Authorization": "Bearer key-b"}
    async with running_sims(1) as sims, recording_proxy(sims[0].url) as rec:
        settings = gateway_settings(backends=vllm_specs([rec]), api_keys_file=str(keys))
        async with running_gateway(settings) as gw:
            status, _, _ = await post(gw.url, turn({"type": "image_url", "image_url": {"url": png_data_url(1, 256)},
                                                 "uuid": "secret-doc"}), a)
            assert status == 200
            key_a = forwarded_uuids(rec)[0]  # what B would need to know (it leaked, say)
            tag_b = gw.gateway.keys.tenant_tag("tenant-b")
            attacks = [
                {"type": "input_image", "image_url": None, "uuid": key_a},
                {"type": "input_image", "image_url": {"url": ""}, "uuid": key_a},
                {"type": "image_url", "image_url": None, "uuid": key_a},
                {"type": "text", "text": "x", "image_url": None, "uuid": key_a},
                {"image_url": None, "uuid": key_a},
                {"type": "image_pil", "image_pil": None, "uuid": key_a},
                {"type": "image_embeds", "image_embeds": None, "uuid": key_a},
            ]
            for attack in attacks:
                before = len(rec.bodies)
                status, body, _ = await post(gw.url, turn(attack), b)
                assert status == 400, (attack, body)
                assert body["error"]["param"] == "messages[0].content[1]"
                if len(rec.bodies) > before:  # it reached the backend: only under B's own tag
                    assert all(u.startswith(tag_b + "/") for u in forwarded_uuids(rec)), rec.bodies[-1]
            # B's own image under A's key (a write) lands in B's namespace, not on A's entry.
            status, _, _ = await post(gw.url, turn({"type": "input_image", "image_url": png_data_url(2), "uuid": key_a}), b)
            assert status == 200 and forwarded_uuids(rec)[0].startswith(tag_b + "/")
            status, _, _ = await post(gw.url, turn({"type": "image_url", "image_url": None, "uuid": "secret-doc"}), a)
            assert status == 200 and sims[0].stats.cache_hits >= 1
            assert gw.gateway.store.peek(key_a) is not None and gw.gateway.store.peek(key_a).data_url() == png_data_url(1, 256)


async def test_urls_in_every_media_shape_pass_the_url_policy_first(origin: ImageOrigin) -> None:
    secret = origin.add("secret.png", solid_image(64, 64, "PNG", 9))
    settings_media = {"allowed_private": ()}  # the secret origin (loopback) is private: refused
    async with running_sims(1) as sims, recording_proxy(sims[0].url) as rec:
        settings = gateway_settings(backends=vllm_specs([rec]), media=settings_media)
        async with running_gateway(settings) as gw:
            shapes = [
                {"type": "input_image", "image_url": {"url": secret}, "uuid": "x"},
                {"type": "input_image", "image_url": secret, "detail": "auto"},
                {"type": "text", "image_url": {"url": secret}, "uuid": "x"},
                {"image_url": secret},
                {"type": "video_url", "video_url": {"url": secret}},
                {"type": "video_url", "video_url": secret},
                {"type": "audio_url", "audio_url": {"url": secret}},
                {"audio_url": secret},
                {"type": "video_url", "video_url": {"url": secret.replace("127.0.0.1", "2130706433")}},
                {"type": "video_url", "video_url": {"url": secret.replace("127.0.0.1", "[::ffff:127.0.0.1]")}},
                {"type": "video_url", "video_url": {"url": secret.replace("127.0.0.1", "localhost")}},
                {"type": "video_url", "video_url": {"url": "http://169.254.169.254/latest/meta-data/"}},
                {"type": "audio_url", "audio_url": {"url": "file:///etc/passwd"}},
                {"type": "video_url", "video_url": {"url": "http://example.com\\@127.0.0.1/x"}},
            ]
            for shape in shapes:
                status, body, _ = await post(gw.url, turn(shape))
                assert status == 400, (shape, body)
                assert body["error"]["param"] == "messages[0].content[1]"
            assert origin.hits["/img/secret.png"] == 0
            assert rec.bodies == []  # nothing reached the backend
    # With the destination opened, a video URL is forwarded in the gateway's own spelling.
    async with running_sims(1) as sims, recording_proxy(sims[0].url) as rec:
        async with running_gateway(gateway_settings(backends=vllm_specs([rec]))) as gw:
            await post(gw.url, turn({"video_url": secret + "#frag"}))
            assert rec.bodies[-1]["messages"][0]["content"][1] == {"type": "video_url", "video_url": {"url": secret}}


async def test_a_client_uuid_spelling_a_content_key_cannot_poison_unlabelled_images() -> None:
    victim = png_data_url(5)
    async with running_sims(1) as sims, recording_proxy(sims[0].url) as rec:
        async with running_gateway(gateway_settings(backends=vllm_specs([rec]))) as gw:
            status, _, _ = await post(gw.url, turn({"type": "image_url", "image_url": {"url": victim}}))
            assert status == 200
            content_key = forwarded_uuids(rec)[0]
            digest = content_key.rsplit(":", 1)[1]
            # The attacker labels its own image with the victim's content key (old and new spelling).
            for forged in (content_key, "sha256:" + digest):
                status, _, _ = await post(gw.url, turn({"type": "image_url", "image_url": {"url": png_data_url(6)},
                                                     "uuid": forged}))
                assert status == 200 and forwarded_uuids(rec)[0] != content_key
            status, _, _ = await post(gw.url, turn({"type": "image_url", "image_url": {"url": victim}}))
            sent = rec.bodies[-1]["messages"][0]["content"][1]
            assert status == 200 and sent["uuid"] == content_key
            stored = gw.gateway.store.peek(content_key)
            assert stored is None or stored.data_url() == victim


async def test_a_refused_audio_or_video_url_is_named_by_its_part_kind_not_as_an_image() -> None:
    async with running_sims(1) as sims, recording_proxy(sims[0].url) as rec:
        async with running_gateway(gateway_settings(backends=vllm_specs([rec]))) as gw:
            cases = [
                ({"type": "video_url", "video_url": {"url": "ftp://8.8.8.8/clip.mp4"}}, "video_url URL scheme 'ftp'"),
                ({"type": "audio_url", "audio_url": {"url": "gopher://8.8.8.8/a.wav"}}, "audio_url URL scheme 'gopher'"),
                ({"type": "video_url", "video_url": {"url": "http://8.8.8.8:0/clip.mp4"}}, "video_url URL"),
                ({"type": "video_url", "video_url": {"url": "file:///etc/passwd"}}, "video_url parts"),
            ]
            for part, expected in cases:
                status, body, _ = await post(gw.url, turn(part))
                assert status == 400, (part, body)
                message = body["error"]["message"]
                assert expected in message and "image" not in message, message
                assert body["error"]["param"] == "messages[0].content[1]"
            assert rec.bodies == []
            # An image part's URL is still an image URL.
            status, body, _ = await post(gw.url, turn({"type": "image_url", "image_url": {"url": "ftp://8.8.8.8/a.png"}}))
            assert status == 400 and "image URL scheme 'ftp'" in body["error"]["message"]
