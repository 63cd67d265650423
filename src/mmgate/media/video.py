"""A bounded check of a ``data:`` video before a backend decodes it: its container is opened and its
first video stream's header read with PyAV (FFmpeg's demuxers; no frame is decoded), and refused
(400 naming the part) unless it is a video within the gateway's limits.

What it bounds: the bytes (the ``data:`` URL is in the request body, under ``--max-body-bytes``),
the probe (FFmpeg's ``probesize``, no stream analysis: a constant, what finding the streams needs),
and — the operator's limits, ``VideoLimits`` from ``--max-video-frame-pixels`` and
``--max-video-seconds`` — the frame size and the duration the container declares. What it cannot: a container whose header lies about its frames (the backend
samples frames from the declared count and fails on its own). An http(s) video URL is fetched by
the backend, not the gateway: only the URL policy applies to it (``mmgate.media.passthrough``).

The check runs in a thread (``asyncio.to_thread``): FFmpeg releases the GIL.
"""

from __future__ import annotations

import asyncio
import binascii
import hashlib
import io
from dataclasses import dataclass
from typing import Protocol

import av
import pybase64

from mmgate.errors import ImageTooLargeError, MediaError, UnsupportedImageError
from mmgate.media.dataurl import decoded_size

# FFmpeg reads at most this much of the container to find its streams.
PROBE_BYTES = 1 << 20
# The defaults of the operator's limits (``MediaSettings``): a declared frame of more pixels, or a
# clip longer than this, is refused before any backend decodes it.
MAX_FRAME_PIXELS = 4096 * 4096
MAX_SECONDS = 3600.0
_MAX_HEADER = 256


@dataclass(frozen=True, slots=True)
class VideoLimits:
    """The largest frame (pixels) and the longest duration (seconds) a ``data:`` video may declare."""

    frame_pixels: int = MAX_FRAME_PIXELS
    seconds: float = MAX_SECONDS


class _VideoSettings(Protocol):
    @property
    def max_video_frame_pixels(self) -> int: ...

    @property
    def max_video_seconds(self) -> float: ...


def video_limits(media: _VideoSettings) -> VideoLimits:
    """The operator's limits, from ``MediaSettings``."""
    return VideoLimits(media.max_video_frame_pixels, media.max_video_seconds)


@dataclass(frozen=True, slots=True)
class VideoInfo:
    """What the container declares of its first video stream."""

    container: str
    codec: str
    width: int
    height: int
    seconds: float
    digest: str  # SHA-256 of the video's bytes: its content key when the client labelled it with no uuid


async def check_video(url: str, *, max_bytes: int, param: str, limits: VideoLimits | None = None) -> VideoInfo:
    """``check_data_video`` in a thread; its error names ``param``."""
    try:
        return await asyncio.to_thread(check_data_video, url, max_bytes=max_bytes, limits=limits)
    except MediaError as exc:
        exc.param = param
        raise


def check_data_video(url: str, *, max_bytes: int, limits: VideoLimits | None = None) -> VideoInfo:
    """The container of a ``data:`` video URL checked (blocking: run it in a thread); raises
    ``UnsupportedImageError`` (400) for what is not a video, ``ImageTooLargeError`` past the limits
    (``limits``; None: the defaults)."""
    max_pixels = limits.frame_pixels if limits is not None else MAX_FRAME_PIXELS
    max_seconds = limits.seconds if limits is not None else MAX_SECONDS
    mime, data = data_payload(url, max_bytes, "video")
    try:
        with open_container(data) as container:
            if container.format.name.endswith("_pipe") or container.format.name == "image2":
                raise UnsupportedImageError(f"the data: video is an image ({container.format.name}), not a video")
            if not container.streams.video:
                raise UnsupportedImageError(f"the data: video ({mime}) holds no video stream")
            stream = container.streams.video[0]
            seconds = float(container.duration or 0) / av.time_base
            info = VideoInfo(container.format.name, stream.codec_context.name or "", stream.width, stream.height,
                             seconds, hashlib.sha256(data).hexdigest())
    except av.FFmpegError as exc:
        raise UnsupportedImageError(f"the data: video is not a video container FFmpeg can read ({exc.strerror})") from exc
    if info.width <= 0 or info.height <= 0:
        raise UnsupportedImageError(f"the data: video's frames have no size ({info.width}x{info.height})")
    if info.width * info.height > max_pixels:
        raise ImageTooLargeError(f"the data: video's frames are {info.width}x{info.height}, over {max_pixels} pixels")
    if info.seconds > max_seconds:
        raise ImageTooLargeError(f"the data: video lasts {info.seconds:.1f} s, over {max_seconds:g} s")
    return info


def open_container(data: bytes) -> av.container.InputContainer:
    """``data`` opened with FFmpeg's demuxers, the probe bounded (``PROBE_BYTES``, no stream analysis)."""
    return av.open(io.BytesIO(data), mode="r", options={"probesize": str(PROBE_BYTES), "analyzeduration": "0"})


def data_payload(url: str, max_bytes: int, medium: str) -> tuple[str, bytes]:
    """The MIME type and bytes of a base64 ``data:<medium>/…`` URL (``medium``: video, audio), at
    most ``max_bytes``."""
    comma = url.find(",", 0, _MAX_HEADER)
    mime, *params = url[5:comma].lower().split(";") if comma > 0 else ("", "")
    if not mime.startswith(f"{medium}/") or "base64" not in params:
        raise UnsupportedImageError(f"a data: {medium} must be data:{medium}/<type>;base64,<data>")
    payload = url[comma + 1:]
    if decoded_size(payload) > max_bytes:
        raise ImageTooLargeError(f"the data: {medium} is over the {max_bytes}-byte limit")
    try:
        return mime, pybase64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:  # ValueError: non-ASCII characters
        raise UnsupportedImageError(f"the data: {medium}'s payload is not valid base64 ({exc})") from exc
