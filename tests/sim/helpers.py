"""Helpers for the sim's tests: request bodies and a JSON POST; images come from tests.support."""

from __future__ import annotations

from typing import Any

import aiohttp

from mmgate._settings import GiB
from mmgate.sim.server import SimServer
from tests.support.http import post
from tests.support.images import data_url, solid_image

__all__ = ["FAST", "cache_gb", "chat_body", "data_url", "image_bytes", "image_part", "post_chat"]

image_bytes = solid_image  # the sim tests' name for it

# Modelled latency divided by a million: tests never wait on the timing model.
FAST = {"host": "127.0.0.1", "port": 0, "speedup": 1e6}


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
    reply = await post(sim.url, body, session=http)
    return reply.status, reply.body
