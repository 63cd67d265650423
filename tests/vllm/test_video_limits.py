"""The operator's video limits (``--max-video-frame-pixels``, ``--max-video-seconds``): a ``data:``
video declaring a larger frame or a longer duration is refused with a 400 naming the part, on chat and
on the passthrough endpoints the gateway polices, before any backend decodes it. No engine is reached,
so the embedded sims stand behind the gateway."""

from __future__ import annotations

import base64
from typing import Any

import aiohttp
import pytest

from mmgate.bench.videos import make_clip
from mmgate.cli import build_parser
from mmgate.media.video import VideoLimits, check_data_video
from mmgate.serve.cli import settings_from_args
from tests.support.gateway import gateway_settings, running_gateway
from tests.vllm.helpers import body, chat

SIM_MODEL = "mmgate-sim-vl"  # the embedded sims' model
CLIP = "data:video/mp4;base64," + base64.b64encode(make_clip(64, 8, 4, "limits")).decode()  # 64x64, 2 s


def video_part(url: str) -> dict[str, Any]:
    return {"type": "video_url", "video_url": {"url": url}}


def test_the_limits_are_flags_and_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MMGATE_MAX_VIDEO_SECONDS", "30")
    args = build_parser().parse_args(["serve", "--max-video-frame-pixels", "921600"])
    media = settings_from_args(args).media
    assert (media.max_video_frame_pixels, media.max_video_seconds) == (921600, 30.0)


def test_the_check_applies_the_limits_it_is_given() -> None:
    assert check_data_video(CLIP, max_bytes=1 << 20).width == 64  # the defaults let it through
    with pytest.raises(Exception, match="64x64, over 4095 pixels"):
        check_data_video(CLIP, max_bytes=1 << 20, limits=VideoLimits(frame_pixels=4095))
    with pytest.raises(Exception, match=r"lasts 2.0 s, over 1.5 s"):
        check_data_video(CLIP, max_bytes=1 << 20, limits=VideoLimits(seconds=1.5))


@pytest.mark.parametrize(("media", "fragment"), [
    ({"max_video_frame_pixels": 64 * 64 - 1}, "over 4095 pixels"),
    ({"max_video_seconds": 1.5}, "over 1.5 s"),
])
async def test_a_video_past_the_operators_limits_is_a_400_naming_the_part(media: dict[str, Any], fragment: str) -> None:
    async with running_gateway(gateway_settings(media=media)) as gw:
        refused = await chat(gw.url, body(video_part(CLIP), text="What happens?", model=SIM_MODEL))
        assert refused.status == 400 and fragment in refused.message, refused.json
        assert refused.json["error"]["param"] == "messages[0].content[1]"
        # /tokenize goes through the passthrough police: the same limits.
        tokenize = {"model": SIM_MODEL, "messages": [{"role": "user", "content": [video_part(CLIP)]}]}
        policed = await chat_path(gw.url + "/tokenize", tokenize)
        assert policed[0] == 400 and fragment in policed[1], policed


async def chat_path(url: str, payload: dict[str, Any]) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.post(url, json=payload) as resp:
        return resp.status, await resp.text()
