"""Video reuse as pure logic: keys namespaced per tenant, repeats stripped only to a backend that
holds them with the same URL, references healed from the remembered URL or refused naming the part."""

from __future__ import annotations

from typing import Any

import pytest

from mmgate.api.chat_request import parse_chat_body
from mmgate.errors import BackendStatusError, UnknownUUIDError
from mmgate.fleet import BackendHoldings
from mmgate.reuse import KeySpace
from mmgate.reuse.videos import VideoURLs, is_video_cache_miss, render_videos, send_healing_videos, video_refs
from mmgate.vllm_protocol import cache_miss_index

URL = "data:video/mp4;base64,AAAA"


def parsed(*parts: dict[str, Any]) -> Any:
    body = {"model": "m", "messages": [{"role": "user", "content": list(parts)}]}
    return parse_chat_body(body, max_images=8, max_uuid_length=64, max_depth=32)


def video(url: str | None, uuid: str) -> dict[str, Any]:
    return {"type": "video_url", "video_url": {"url": url} if url else None, "uuid": uuid}


def test_keys_are_the_tenants_and_the_url_is_remembered() -> None:
    keys, urls = KeySpace(b"s" * 32), VideoURLs()
    refs_a = video_refs(parsed(video(URL, "clip")).passthrough, keys, "a", urls)
    refs_b = video_refs(parsed(video(None, "clip")).passthrough, keys, "b", urls)
    assert refs_a[0].key == keys.backend_uuid("a", "clip") != refs_b[0].key
    assert urls.get(refs_a[0].key) == URL and urls.get(refs_b[0].key) is None


def test_a_repeat_is_a_reference_only_where_held_with_the_same_url() -> None:
    keys, urls = KeySpace(), VideoURLs()
    [first] = video_refs(parsed(video(URL, "clip")).passthrough, keys, None, urls)
    assert render_videos([first], urls, lambda key: True, strip=True) == 0  # first time: sent with its URL
    [ref] = video_refs(parsed(video(URL, "clip")).passthrough, keys, None, urls)
    assert render_videos([ref], urls, lambda key: False, strip=True) == 0 and ref.part["video_url"] == {"url": URL}
    assert render_videos([ref], urls, lambda key: True, strip=True) == 1 and ref.part["video_url"] is None
    assert render_videos([ref], urls, lambda key: True, strip=False) == 0 and ref.part["video_url"] == {"url": URL}
    [other] = video_refs(parsed(video(URL + "BBBB", "clip")).passthrough, keys, None, urls)
    assert render_videos([other], urls, lambda key: True, strip=True) == 0  # the key sent with another URL
    assert other.part["video_url"] == {"url": URL + "BBBB"} and other.part["uuid"] == "clip"


def test_a_reference_heals_from_the_remembered_url_or_names_the_part() -> None:
    keys, urls = KeySpace(), VideoURLs()
    video_refs(parsed(video(URL, "seen")).passthrough, keys, None, urls)
    refs = video_refs(parsed({"type": "text", "text": "x"}, video(None, "seen"), video(None, "never")).passthrough,
                      keys, None, urls)
    render_videos(refs[:1], urls, lambda key: False, strip=True)
    assert refs[0].part["video_url"] is None
    render_videos(refs[:1], urls, lambda key: False, strip=True, force_data=True)
    assert refs[0].part["video_url"] == {"url": URL}
    with pytest.raises(UnknownUUIDError) as info:
        render_videos(refs, urls, lambda key: False, strip=True, force_data=True)
    assert info.value.param == "messages[0].content[2]" and "never" in info.value.message


def test_a_backend_that_reads_no_uuid_gets_urls_and_no_key() -> None:
    urls = VideoURLs()
    [ref] = video_refs(parsed(video(URL, "clip")).passthrough, KeySpace(), None, urls)
    render_videos([ref], urls, lambda key: True, strip=True, force_data=True, with_uuid=False)
    assert ref.part == {"type": "video_url", "video_url": {"url": URL}}


def test_the_url_memory_is_bounded_least_recently_used_first() -> None:
    urls = VideoURLs(max_chars=10)
    urls.remember("a", "12345")
    urls.remember("b", "12345")
    assert urls.get("a") == "12345"
    urls.remember("c", "12345")
    assert (urls.get("a"), urls.get("b"), urls.get("c")) == ("12345", None, "12345")
    urls.remember("d", "x" * 11)  # larger than the whole memory: not kept, nothing evicted
    assert urls.get("d") is None and len(urls) == 2


def miss(modality: str) -> BackendStatusError:
    body = {"error": {"message": f"Cache miss for {modality} at index 0 but data is not provided.",
                      "type": "BadRequestError", "param": None, "code": 400}}
    return BackendStatusError("miss", backend_status=400, body=body)


def test_a_video_miss_is_told_from_an_image_miss() -> None:
    assert is_video_cache_miss(miss("video")) and not is_video_cache_miss(miss("image"))
    assert cache_miss_index(400, miss("video").body) is None and cache_miss_index(400, miss("image").body) == 0


async def test_a_video_miss_is_healed_once_with_the_url() -> None:
    keys, urls = KeySpace(), VideoURLs()
    video_refs(parsed(video(URL, "clip")).passthrough, keys, None, urls)
    request = parsed(video(None, "clip"))
    refs = video_refs(request.passthrough, keys, None, urls)
    holdings = BackendHoldings(1 << 30, max_entries=10, max_keys=10)
    holdings.hold("b0", [("clip", 1)])
    sent: list[Any] = []

    async def send() -> str:
        sent.append(dict(request.body["messages"][0]["content"][0]))
        if len(sent) == 1:
            raise miss("video")
        return "ok"

    healed: list[int] = []
    assert await send_healing_videos(send, refs, urls, holdings, "b0", with_uuid=True, strip=True,
                                     on_heal=lambda: healed.append(1)) == "ok"
    assert [p["video_url"] for p in sent] == [None, {"url": URL}] and healed == [1]
    assert not holdings.holds("b0", "clip")


def test_a_checked_data_video_without_a_uuid_is_keyed_by_its_content() -> None:
    keys, urls = KeySpace(b"s" * 32), VideoURLs()
    request = parsed({"type": "video_url", "video_url": {"url": URL}}, {"type": "video_url", "video_url": {"url": URL}})
    request.passthrough[0].digest = "ab" * 32  # set by the container check (mmgate.media.video)
    [ref] = video_refs(request.passthrough, keys, "a", urls)
    assert ref.key == keys.content_uuid("a", "ab" * 32) and ref.part["uuid"] == ref.key
    assert "uuid" not in request.passthrough[1].part  # no uuid, no digest: no key, nothing to reuse
