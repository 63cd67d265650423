"""The policed endpoints (``/tokenize`` and the other chat-style bodies forwarded as they came) check a
``data:`` video's container as chat does, and drop a video's uuid as they drop an image's."""

from __future__ import annotations

from typing import Any

import pytest

from mmgate.api.police import police
from mmgate.errors import InvalidRequestError, UnsupportedImageError
from tests.media.test_video import clip, data_url


async def allow(url: str, param: str, kind: str) -> str:
    return url


def tokenize(part: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": [part]}]}


async def test_a_data_video_that_is_no_video_is_refused_naming_the_field() -> None:
    body = tokenize({"type": "video_url", "video_url": {"url": data_url(b"\x00" * 64)}})
    with pytest.raises(UnsupportedImageError) as info:
        await police(body, allow, max_uuid_length=64, max_depth=32)
    assert info.value.status == 400 and info.value.param == "messages[0].content[0]"


async def test_a_real_data_video_passes_without_its_uuid() -> None:
    url = data_url(clip())
    body = tokenize({"type": "video_url", "video_url": {"url": url}, "uuid": "clip"})
    assert await police(body, allow, max_uuid_length=64, max_depth=32)
    assert body["messages"][0]["content"][0] == {"type": "video_url", "video_url": {"url": url}}


async def test_a_video_reference_is_refused_there() -> None:
    body = tokenize({"type": "video_url", "video_url": None, "uuid": "clip"})
    with pytest.raises(InvalidRequestError, match="cache-only video_url reference"):
        await police(body, allow, max_uuid_length=64, max_depth=32)
