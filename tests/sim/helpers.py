"""Helpers for the sim's tests: images made with Pillow, request bodies, a JSON POST."""

from __future__ import annotations

import base64
import io
from typing import Any

import aiohttp
from PIL import Image

from mmgate._settings import GiB
from mmgate.sim.server import SimServer

# Modelled latency divided by a million: tests never wait on the timing model.
FAST = {"host": "127.0.0.1", "port": 0, "speedup": 1e6}


def image_bytes(width: int = 64, height: int = 64, fmt: str = "PNG", seed: int = 0) -> bytes:
    """A small image whose pixels depend on ``seed`` (distinct seeds → distinct content)."""
    img = Image.new("RGB", (width, height), ((seed * 37) % 256, (seed * 91) % 256, (seed * 53) % 256))
    img.putpixel((seed % width, (seed // width) % height), (255, 255, 255))
    buf = io.BytesIO()
    img.save(buf, fmt)
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode("ascii")


def image_part(url: str | None = None, uuid: str | None = None, **extra: Any) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "image_url", "image_url": {"url": url} if url is not None else None}
    if uuid is not None:
        part["uuid"] = uuid
    part.update(extra)
    return part


def chat_body(*parts: dict[str, Any], text: str = "Describe the image.", **extra: Any) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}, *parts]
    return {"model": "mmgate-sim-vl", "messages": [{"role": "user", "content": content}], **extra}


def cache_gb(num_bytes: int) -> float:
    return num_bytes / GiB


async def post_chat(http: aiohttp.ClientSession, sim: SimServer, body: Any) -> tuple[int, Any]:
    """POST a JSON body; return the status and the decoded JSON answer."""
    async with http.post(f"{sim.url}/v1/chat/completions", json=body) as resp:
        return resp.status, await resp.json(content_type=None)
