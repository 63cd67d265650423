"""A bounded check of a ``data:`` video before a backend decodes it: its container is opened and its
first video stream's header read with PyAV (FFmpeg's demuxers; no frame is decoded), and refused
(400 naming the part) unless it is a video within the gateway's limits.

What it bounds: the bytes (the ``data:`` URL is in the request body, under ``--max-body-bytes``),
the probe (FFmpeg's ``probesize``, no stream analysis), the frame size and the duration the
container declares. What it cannot: a container whose header lies about its frames (the backend
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

import av
import pybase64

from mmgate.errors import ImageTooLargeError, MediaError, UnsupportedImageError
from mmgate.media.dataurl import decoded_size

# FFmpeg reads at most this much of the container to find its streams.
PROBE_BYTES = 1 << 20
# A declared frame of more pixels, or a clip longer than this, is refused before any backend decodes it.
MAX_FRAME_PIXELS = 4096 * 4096
MAX_SECONDS = 3600.0
_MAX_HEADER = 256


@dataclass(frozen=True, slots=True)
class VideoInfo:
    """What the container declares of its first video stream."""

    container: str
    codec: str
    width: int
    height: int
    seconds: float
    digest: str  # SHA-256 of the video's bytes: its content key when the client labelled it with no uuid


async def check_video(url: str, *, max_bytes: int, param: str) -> VideoInfo:
    """``check_data_video`` in a thread; its error names ``param``."""
    try:
        return await asyncio.to_thread(check_data_video, url, max_bytes=max_bytes)
    except MediaError as exc:
        exc.param = param
        raise


def check_data_video(url: str, *, max_bytes: int) -> VideoInfo:
    """The container of a ``data:`` video URL checked (blocking: run it in a thread); raises
    ``UnsupportedImageError`` (400) for what is not a video, ``ImageTooLargeError`` past the limits."""
    mime, data = _payload(url, max_bytes)
    try:
        with av.open(io.BytesIO(data), mode="r",
                     options={"probesize": str(PROBE_BYTES), "analyzeduration": "0"}) as container:
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
    if info.width * info.height > MAX_FRAME_PIXELS:
        raise ImageTooLargeError(f"the data: video's frames are {info.width}x{info.height}, over {MAX_FRAME_PIXELS} pixels")
    if info.seconds > MAX_SECONDS:
        raise ImageTooLargeError(f"the data: video lasts {info.seconds:.0f} s, over {MAX_SECONDS:.0f} s")
    return info


def _payload(url: str, max_bytes: int) -> tuple[str, bytes]:
    """The MIME type and bytes of a base64 ``data:video/…`` URL, at most ``max_bytes``."""
    comma = url.find(",", 0, _MAX_HEADER)
    mime, *params = url[5:comma].lower().split(";") if comma > 0 else ("", "")
    if not mime.startswith("video/") or "base64" not in params:
        raise UnsupportedImageError("a data: video must be data:video/<type>;base64,<data>")
    payload = url[comma + 1:]
    if decoded_size(payload) > max_bytes:
        raise ImageTooLargeError(f"the data: video is over the {max_bytes}-byte limit")
    try:
        return mime, pybase64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:  # ValueError: non-ASCII characters
        raise UnsupportedImageError(f"the data: video's payload is not valid base64 ({exc})") from exc
