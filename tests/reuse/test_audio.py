"""Audio reuse goes the way of video's (``mmgate.reuse.videos``): ``audio_url`` and ``input_audio``
parts keyed by tenant, repeats stripped where held, references healed with the data last seen
(an ``input_audio`` re-sent as ``{"data", "format"}``), vLLM's audio miss told from the others."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from mmgate.api.chat_request import parse_chat_body
from mmgate.errors import UnknownUUIDError
from mmgate.fleet import BackendHoldings
from mmgate.reuse import KeySpace
from mmgate.reuse.videos import (
    AUDIO_HELD_BYTES,
    VIDEO_HELD_BYTES,
    VideoURLs,
    is_video_cache_miss,
    render_videos,
    send_healing_videos,
    video_refs,
)
from tests.reuse.test_store import tier
from tests.reuse.test_videos import miss

DATA = "UklGRiQAAABXQVZF"
INPUT = {"data": DATA, "format": "wav"}


def parsed(*parts: dict[str, Any]) -> Any:
    body = {"model": "m", "messages": [{"role": "user", "content": list(parts)}]}
    return parse_chat_body(body, max_images=8, max_uuid_length=64, max_depth=32)


def audio(uuid: str | None, data: bool = True) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "input_audio", "input_audio": dict(INPUT) if data else None}
    if uuid is not None:
        part["uuid"] = uuid
    return part


def test_input_audio_is_keyed_and_stripped_as_a_video() -> None:
    keys, urls = KeySpace(b"s" * 32), VideoURLs()
    [first] = video_refs(parsed(audio("a1")).passthrough, keys, "t", urls)
    assert first.key == keys.backend_uuid("t", "a1") and urls.get(first.key) == "data:audio/wav;base64," + DATA
    assert (first.medium, first.held_bytes) == ("audio", AUDIO_HELD_BYTES) and AUDIO_HELD_BYTES < VIDEO_HELD_BYTES
    assert render_videos([first], urls, lambda key: True, strip=True) == 0 and first.part["input_audio"] == INPUT
    [repeat] = video_refs(parsed(audio("a1")).passthrough, keys, "t", urls)
    assert render_videos([repeat], urls, lambda key: True, strip=True) == 1
    assert repeat.part == {"type": "input_audio", "input_audio": None, "uuid": first.key}


def test_a_reference_heals_with_the_data_or_names_the_part() -> None:
    keys, urls = KeySpace(), VideoURLs()
    video_refs(parsed(audio("seen")).passthrough, keys, None, urls)
    refs = video_refs(parsed(audio("seen", data=False), {"type": "audio_url", "audio_url": None, "uuid": "never"})
                      .passthrough, keys, None, urls)
    render_videos(refs[:1], urls, lambda key: False, strip=True, force_data=True)
    assert refs[0].part["input_audio"] == INPUT
    with pytest.raises(UnknownUUIDError) as info:
        render_videos(refs, urls, lambda key: False, strip=True, force_data=True)
    assert info.value.param == "messages[0].content[1]" and "unknown audio uuid 'never'" in info.value.message


def test_audio_content_keys_are_apart_from_a_videos_of_the_same_bytes() -> None:
    keys, urls = KeySpace(), VideoURLs()
    url = "data:audio/mp4;base64,AAAA"
    request = parsed({"type": "audio_url", "audio_url": {"url": url}},
                     {"type": "video_url", "video_url": {"url": url.replace("audio", "video")}})
    for p in request.passthrough:
        p.digest = "ab" * 32  # set by the container checks (mmgate.media.audio, mmgate.media.video)
    audio_ref, video_ref = video_refs(request.passthrough, keys, None, urls)
    assert audio_ref.key == keys.content_uuid(None, "audio-" + "ab" * 32) != video_ref.key


def test_an_audio_miss_is_healed_only_for_audio() -> None:
    assert is_video_cache_miss(miss("audio"), {"audio"}) and not is_video_cache_miss(miss("audio"))
    assert not is_video_cache_miss(miss("image"), {"audio", "video"})


def first_send_misses(request: Any, sent: list[Any]) -> Callable[[], Awaitable[str]]:
    """A backend send that records each body's audio part; vLLM's cache misses it the first time."""
    async def send() -> str:
        sent.append(dict(request.body["messages"][0]["content"][0]))
        if len(sent) == 1:
            raise miss("audio")
        return "ok"
    return send


async def test_an_audio_miss_is_healed_once_with_the_data() -> None:
    keys, urls = KeySpace(), VideoURLs()
    video_refs(parsed(audio("a1")).passthrough, keys, None, urls)
    request = parsed(audio("a1", data=False))
    refs = video_refs(request.passthrough, keys, None, urls)
    holdings = BackendHoldings(1 << 30, max_entries=10, max_keys=10)
    sent: list[Any] = []
    send = first_send_misses(request, sent)

    assert await send_healing_videos(send, refs, urls, holdings, "b0", with_uuid=True, strip=True,
                                     on_heal=lambda: None) == "ok"
    assert [p["input_audio"] for p in sent] == [None, INPUT]


async def test_another_gateway_heals_an_audio_reference_from_the_shared_tier(standalone_server: Any) -> None:
    """An input_audio's data goes to the shared tier under its key; a gateway that never saw it (a
    restart, another in the fleet) heals vLLM's audio miss with it, re-sent as ``{data, format}``."""
    shared = tier(standalone_server)
    keys = KeySpace(b"s" * 32)
    first = VideoURLs(shared=shared)
    video_refs(parsed(audio("a1")).passthrough, keys, "t", first)
    await first.close()  # waits for the background write
    second = VideoURLs(shared=shared)
    request = parsed(audio("a1", data=False))
    refs = video_refs(request.passthrough, keys, "t", second)
    assert second.get(refs[0].key) is None
    sent: list[Any] = []
    send = first_send_misses(request, sent)
    holdings = BackendHoldings(1 << 30, max_entries=10, max_keys=10)
    assert await send_healing_videos(send, refs, second, holdings, "b0", with_uuid=True, strip=True,
                                     on_heal=lambda: None) == "ok"
    assert [p["input_audio"] for p in sent] == [None, INPUT] and sent[1]["uuid"] == keys.backend_uuid("t", "a1")
    await shared.close()
