"""The bounded container check of a ``data:`` audio (PyAV): a real WAV (written here with the
standard library) passes with what its header declares; what is not audio, or past the limits, is
refused with a 400 naming the part, on chat and on the policed endpoints."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from mmgate.api.police import police
from mmgate.config import MediaSettings
from mmgate.errors import ImageTooLargeError, UnsupportedImageError
from mmgate.media import audio as audio_module
from mmgate.media.audio import (
    audio_data_url,
    check_audio,
    check_data_audio,
    check_data_media,
    input_audio_value,
    media_url,
    media_value,
)
from tests.media.test_video import clip
from tests.support.audio import data_url, wav


def test_a_real_wav_passes_with_what_it_declares() -> None:
    info = check_data_audio(data_url(wav(2.0, 22050, 2)), max_bytes=1 << 20)
    assert (info.container, info.codec, info.sample_rate, info.channels) == ("wav", "pcm_s16le", 22050, 2)
    assert info.seconds == pytest.approx(2.0, abs=0.05) and len(info.digest) == 64


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        (data_url(b"\x00" * 1000), "not an audio container"),
        (data_url(clip()), "no audio stream"),
        ("data:video/mp4;base64,AAAA", "data:audio/"),
        ("data:audio/wav,AAAA", "data:audio/"),
        ("data:audio/wav;base64,!!!!", "not valid base64"),
    ],
    ids=["zeros", "a-silent-video", "video-mime", "not-base64", "bad-base64"],
)
def test_what_is_not_audio_is_refused(url: str, fragment: str) -> None:
    with pytest.raises(UnsupportedImageError) as info:
        check_data_audio(url, max_bytes=1 << 20)
    assert info.value.status == 400 and fragment in info.value.message


def test_the_limits_are_the_operators_and_the_constants(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ImageTooLargeError, match=r"lasts 2\.0 s, over 1 s"):
        check_data_audio(data_url(wav(2.0)), max_bytes=1 << 20, max_seconds=1)
    with pytest.raises(ImageTooLargeError, match="byte limit"):
        check_data_audio(data_url(wav(2.0)), max_bytes=1000)
    monkeypatch.setattr(audio_module, "MAX_SAMPLE_RATE", 8000)
    with pytest.raises(UnsupportedImageError, match="16000 samples a second"):
        check_data_audio(data_url(wav()), max_bytes=1 << 20)
    monkeypatch.setattr(audio_module, "MAX_CHANNELS", 1)
    with pytest.raises(UnsupportedImageError, match="2 channels"):
        check_data_audio(data_url(wav(0.1, 8000, 2)), max_bytes=1 << 20)


async def test_the_check_names_the_part_and_dispatches_by_kind() -> None:
    with pytest.raises(UnsupportedImageError) as info:
        await check_audio(data_url(b"\x00" * 64), max_bytes=1 << 20, param="messages[0].content[1]")
    assert info.value.param == "messages[0].content[1]"
    media = MediaSettings(max_audio_seconds=1)
    with pytest.raises(ImageTooLargeError) as too_long:
        await check_data_media("input_audio", data_url(wav(2.0)), max_bytes=1 << 20, param="p", media=media)
    assert too_long.value.param == "p"
    assert await check_data_media("audio_url", data_url(wav(0.5)), max_bytes=1 << 20, param="p", media=media)
    assert await check_data_media("image_url", "data:image/png;base64,AAAA", max_bytes=1, param="p", media=media) is None


def test_input_audio_is_the_url_vllm_reads_it_as() -> None:
    url = audio_data_url("UklG", "mp3")
    assert url == "data:audio/mp3;base64,UklG"
    assert input_audio_value(url) == {"data": "UklG", "format": "mp3"} == media_value("input_audio", url)
    assert media_url("input_audio", {"data": "UklG", "format": "mp3"}) == url
    assert media_value("audio_url", url) == {"url": url} and media_url("audio_url", {"url": url}) == url
    with pytest.raises(ValueError):
        input_audio_value("data:video/mp4;base64,AAAA")


async def allow(url: str, param: str, kind: str) -> str:
    return url


def tokenize(part: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": [part]}]}


async def test_the_policed_endpoints_check_audio_and_drop_its_uuid() -> None:
    data = base64.b64encode(wav(0.5)).decode()
    body = tokenize({"type": "input_audio", "input_audio": {"data": data, "format": "wav"}, "uuid": "a"})
    assert await police(body, allow, max_uuid_length=64, max_depth=32)
    assert body["messages"][0]["content"][0] == {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}
    bad = tokenize({"type": "audio_url", "audio_url": {"url": data_url(b"\x00" * 64)}})
    with pytest.raises(UnsupportedImageError) as info:
        await police(bad, allow, max_uuid_length=64, max_depth=32)
    assert info.value.param == "messages[0].content[0]"
    long = tokenize({"type": "input_audio", "input_audio": {"data": data, "format": "wav"}})
    with pytest.raises(ImageTooLargeError):
        await police(long, allow, max_uuid_length=64, max_depth=32, media=MediaSettings(max_audio_seconds=0.1))
