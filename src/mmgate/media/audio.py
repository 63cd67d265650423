"""A bounded check of a ``data:`` audio before a backend decodes it, as a ``data:`` video's
(``mmgate.media.video``): its container opened and its first audio stream's header read with PyAV
(no sample decoded), and refused (400 naming the part) unless it is audio within the limits.

What it bounds: the bytes (in the request body, under ``--max-body-bytes``), the probe (FFmpeg's
``probesize``), the declared duration (``--max-audio-seconds``: the operator's limit, what the
backend's resampling and features cost), and — constants, no operator decides them — the sample
rate and the channels (a header claiming 10⁹ samples a second is not audio a model reads). What it
cannot: a container whose header lies about its length (the backend decodes it all). An http(s)
audio URL is fetched by the backend: only the URL policy applies to it (``mmgate.media.passthrough``).

``input_audio`` parts carry the same bytes as base64 ``data`` + ``format``; vLLM reads them as the
URL ``data:audio/<format>;base64,<data>`` (``parse_input_audio``), and so does the gateway
(``audio_data_url``, ``input_audio_value``), which lets one path check, key and heal both shapes.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from typing import Protocol

import av

from mmgate.errors import ImageTooLargeError, MediaError, UnsupportedImageError
from mmgate.media.video import check_video, data_payload, open_container, video_limits

MAX_SECONDS = 3600.0  # the default of --max-audio-seconds
MAX_SAMPLE_RATE = 384_000  # the highest rate audio hardware records
MAX_CHANNELS = 32
AUDIO_KINDS = frozenset({"audio_url", "input_audio"})
_AUDIO_PREFIX = "data:audio/"
_B64 = ";base64,"


@dataclass(frozen=True, slots=True)
class AudioInfo:
    """What the container declares of its first audio stream."""

    container: str
    codec: str
    sample_rate: int
    channels: int
    seconds: float
    digest: str  # SHA-256 of the bytes: the content key of an audio sent without a uuid


class _AudioSettings(Protocol):
    @property
    def max_audio_seconds(self) -> float: ...


class _MediaSettings(_AudioSettings, Protocol):
    @property
    def max_video_frame_pixels(self) -> int: ...

    @property
    def max_video_seconds(self) -> float: ...


async def check_audio(url: str, *, max_bytes: int, param: str, max_seconds: float = MAX_SECONDS) -> AudioInfo:
    """``check_data_audio`` in a thread (FFmpeg releases the GIL); its error names ``param``."""
    try:
        return await asyncio.to_thread(check_data_audio, url, max_bytes=max_bytes, max_seconds=max_seconds)
    except MediaError as exc:
        exc.param = param
        raise


def check_data_audio(url: str, *, max_bytes: int, max_seconds: float = MAX_SECONDS) -> AudioInfo:
    """The container of a ``data:audio/…`` URL checked (blocking); ``UnsupportedImageError`` (400)
    for what is not audio, ``ImageTooLargeError`` past the limits."""
    mime, data = data_payload(url, max_bytes, "audio")
    try:
        with open_container(data) as container:
            if not container.streams.audio:
                raise UnsupportedImageError(f"the data: audio ({mime}) holds no audio stream")
            stream = container.streams.audio[0]
            seconds = float(container.duration or 0) / av.time_base
            info = AudioInfo(container.format.name, stream.codec_context.name or "", stream.sample_rate or 0,
                             stream.channels or 0, seconds, hashlib.sha256(data).hexdigest())
    except av.FFmpegError as exc:
        raise UnsupportedImageError(f"the data: audio is not an audio container FFmpeg can read ({exc.strerror})") from exc
    if not 0 < info.sample_rate <= MAX_SAMPLE_RATE:
        raise UnsupportedImageError(f"the data: audio declares {info.sample_rate} samples a second "
                                    f"(1 to {MAX_SAMPLE_RATE} accepted)")
    if not 0 < info.channels <= MAX_CHANNELS:
        raise UnsupportedImageError(f"the data: audio declares {info.channels} channels (1 to {MAX_CHANNELS} accepted)")
    if info.seconds > max_seconds:
        raise ImageTooLargeError(f"the data: audio lasts {info.seconds:.1f} s, over {max_seconds:g} s")
    return info


async def check_data_media(kind: str, url: str, *, max_bytes: int, param: str, media: _MediaSettings) -> str | None:
    """The content digest of a ``data:`` video or audio part (``kind``: its part type) once its
    container passed its check under the operator's limits (``MediaSettings``); None for another kind."""
    if kind == "video_url":
        return (await check_video(url, max_bytes=max_bytes, param=param, limits=video_limits(media))).digest
    if kind in AUDIO_KINDS:
        return (await check_audio(url, max_bytes=max_bytes, param=param, max_seconds=media.max_audio_seconds)).digest
    return None


def audio_data_url(data: str, fmt: str) -> str:
    """An ``input_audio``'s ``data`` and ``format`` as the URL vLLM reads them as."""
    return f"{_AUDIO_PREFIX}{fmt};base64,{data}"


def input_audio_value(url: str) -> dict[str, str]:
    """``audio_data_url``'s inverse: the ``input_audio`` object of a ``data:audio/<format>;base64,`` URL."""
    comma = url.find(_B64)
    if not url.startswith(_AUDIO_PREFIX) or comma < 0:
        raise ValueError("not a data:audio/<format>;base64, URL")
    return {"data": url[comma + len(_B64):], "format": url[len(_AUDIO_PREFIX):comma]}


def media_url(kind: str, value: dict[str, str]) -> str:
    """``media_value``'s inverse: the URL of a part's media value."""
    return audio_data_url(value["data"], value["format"]) if kind == "input_audio" else value["url"]


def media_value(kind: str, url: str) -> dict[str, str]:
    """A part's media value for its checked ``url``: ``{"url"}``, or an ``input_audio``'s
    ``{"data", "format"}``."""
    return input_audio_value(url) if kind == "input_audio" else {"url": url}
