"""Videos in a benchmark: what a dataset may name as one, and the synthetic clips of the generator.

A dataset video is an ``http(s)://`` URL (sent as it is), a ``data:video/<type>;base64,`` URL or a
file whose first bytes are those of a video container (MP4/QuickTime, Matroska/WebM, AVI); at most
``MAX_VIDEO_BYTES``. The bench never decodes one: the server does.

Synthetic clips (``mmgate bench dataset sliding-window --media video``) are short MPEG-4 Part 2
streams in MP4, written with PyAV (FFmpeg) before anything is sent: ``frames`` frames of
``size``x``size`` at ``fps``, each clip's colours and moving blocks drawn from its own seed, so every
clip is distinct and the same seed always makes the same bytes. MPEG-4 Part 2 because every FFmpeg
and OpenCV build decodes it (vLLM reads videos with OpenCV).
"""

from __future__ import annotations

import io
import random

import av
import numpy as np

# A dataset video past this size is refused (its data: URL would be a third larger, in every request
# that carries it).
MAX_VIDEO_BYTES = 64 << 20


def sniff_video_type(data: bytes) -> tuple[str, str] | None:
    """(mime, extension) of a video container from its first bytes; None when it is not one."""
    if data[4:8] == b"ftyp":
        return ("video/quicktime", ".mov") if data[8:12] == b"qt  " else ("video/mp4", ".mp4")
    if data.startswith(b"\x1a\x45\xdf\xa3"):
        return ("video/webm", ".webm") if b"webm" in data[:64] else ("video/x-matroska", ".mkv")
    if data[:4] == b"RIFF" and data[8:12] == b"AVI ":
        return "video/x-msvideo", ".avi"
    return None


def make_clip(size: int, frames: int, fps: int, key: str) -> bytes:
    """A distinct, deterministic MP4 clip: a coloured background with blocks that move frame to frame."""
    if size < 16 or size % 2:
        raise ValueError("a clip's side must be an even number of pixels, at least 16")
    rng = random.Random(key)
    background = np.array([rng.randrange(256) for _ in range(3)], dtype=np.uint8)
    blocks = [(rng.randrange(size), rng.randrange(size), rng.randrange(4, max(5, size // 3)),
               rng.randrange(-3, 4), rng.randrange(-3, 4), [rng.randrange(256) for _ in range(3)])
              for _ in range(6)]
    out = io.BytesIO()
    with av.open(out, mode="w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        for i in range(frames):
            picture = np.empty((size, size, 3), dtype=np.uint8)
            picture[:] = background
            for x, y, side, dx, dy, color in blocks:
                x0, y0 = (x + dx * i * side // 4) % size, (y + dy * i * side // 4) % size
                picture[y0:y0 + side, x0:x0 + side] = color
            frame = av.VideoFrame.from_ndarray(picture, format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return out.getvalue()
