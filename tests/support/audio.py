"""WAV audio made on the spot, and its ``data:`` URL (the audio tests and the audio study)."""

from __future__ import annotations

import base64
import io
import math
import struct
import wave


def wav(seconds: float = 1.0, rate: int = 16000, channels: int = 1, freq: float = 440.0) -> bytes:
    """A sine tone as 16-bit PCM WAV."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        samples = (int(8000 * math.sin(2 * math.pi * freq * i / rate)) for i in range(int(seconds * rate)))
        w.writeframes(b"".join(struct.pack("<h", s) * channels for s in samples))
    return out.getvalue()


def data_url(data: bytes, mime: str = "audio/wav") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()
