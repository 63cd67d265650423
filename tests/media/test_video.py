"""The bounded container check of a ``data:`` video (PyAV): a real clip (encoded here with PyAV)
passes with what its container declares; what is not a video, or past the limits, is refused with a
400 before any backend decodes it."""

from __future__ import annotations

import base64
import io

import av
import numpy as np
import pytest

from mmgate.errors import ImageTooLargeError, UnsupportedImageError
from mmgate.media import video as video_module
from mmgate.media.video import check_data_video, check_video


def clip(frames: int = 8, side: int = 64, fmt: str = "mp4") -> bytes:
    """``frames`` frames of noise, MPEG-4 part 2 at 4 fps, in an in-memory ``fmt`` container."""
    out = io.BytesIO()
    with av.open(out, mode="w", format=fmt) as container:
        stream = container.add_stream("mpeg4", rate=4)
        stream.width = stream.height = side
        stream.pix_fmt = "yuv420p"
        rng = np.random.default_rng(1)
        for _ in range(frames):
            frame = av.VideoFrame.from_ndarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return out.getvalue()


def data_url(data: bytes, mime: str = "video/mp4") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def test_a_real_clip_passes_with_what_it_declares() -> None:
    info = check_data_video(data_url(clip()), max_bytes=1 << 20)
    assert (info.codec, info.width, info.height) == ("mpeg4", 64, 64)
    assert "mp4" in info.container and 1.5 <= info.seconds <= 2.5


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        (data_url(b"\x00" * 1000), "not a video container"),
        (data_url(clip()[:200]), "not a video container"),
        (data_url(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64), "not a video"),
        ("data:image/png;base64,AAAA", "data:video/"),
        ("data:video/mp4,AAAA", "data:video/"),
        ("data:video/mp4;base64,!!!!", "not valid base64"),
    ],
    ids=["zeros", "truncated", "png", "image-mime", "not-base64", "bad-base64"],
)
def test_what_is_not_a_video_is_refused(url: str, fragment: str) -> None:
    with pytest.raises(UnsupportedImageError) as info:
        check_data_video(url, max_bytes=1 << 20)
    assert info.value.status == 400 and fragment in info.value.message


def test_limits_are_checked_before_a_backend_decodes(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ImageTooLargeError):
        check_data_video(data_url(clip()), max_bytes=100)
    monkeypatch.setattr(video_module, "MAX_FRAME_PIXELS", 32 * 32)
    with pytest.raises(ImageTooLargeError, match="64x64"):
        check_data_video(data_url(clip()), max_bytes=1 << 20)
    monkeypatch.setattr(video_module, "MAX_FRAME_PIXELS", 4096 * 4096)
    monkeypatch.setattr(video_module, "MAX_SECONDS", 1.0)
    with pytest.raises(ImageTooLargeError, match="lasts"):
        check_data_video(data_url(clip()), max_bytes=1 << 20)


async def test_the_async_check_names_the_part() -> None:
    with pytest.raises(UnsupportedImageError) as info:
        await check_video(data_url(b"\x00" * 100), max_bytes=1 << 20, param="messages[0].content[1]")
    assert info.value.param == "messages[0].content[1]"
