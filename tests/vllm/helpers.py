"""Request helpers for the real-vLLM tests: bounded aiohttp calls, SSE parsing, image parts."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from tests.support.images import data_url, make_image
from tests.support.vllm import SERVED_MODEL, VllmReplica

# Every request of these tests is bounded (a wedged replica fails the test, it does not hang it).
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=90, sock_connect=10)
_seeds = itertools.count(1000)


def fresh_jpeg(side: int = 224) -> str:
    """A data URL of a JPEG nobody has sent before (224x224: 64 image tokens on Qwen2-VL)."""
    return data_url(make_image("JPEG", side, side, seed=next(_seeds), noise=0.5), "image/jpeg")


def image(url: str | None, uuid: str | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "image_url", "image_url": {"url": url} if url is not None else None}
    if uuid is not None:
        part["uuid"] = uuid
    return part


def body(*parts: dict[str, Any], text: str = "Describe the image.", **extra: Any) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}, *parts]
    return {"model": SERVED_MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": content}], **extra}


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    json: Any = None
    events: list[Any] = field(default_factory=list)

    @property
    def message(self) -> str:
        return str((self.json or {}).get("error", {}).get("message", ""))

    def reuse(self) -> dict[str, int]:
        """``x-mmgate-reuse`` as numbers: sent, stripped, referenced, healed."""
        text = self.headers.get("x-mmgate-reuse", "")
        return {k.strip(): int(v) for k, _, v in (p.partition("=") for p in text.split(";")) if k.strip()}


async def chat(url: str, payload: dict[str, Any], headers: dict[str, str] | None = None) -> Answer:
    """POST /v1/chat/completions to ``url``; parses JSON or, for SSE, every ``data:`` event."""
    async with aiohttp.ClientSession(timeout=REQUEST_TIMEOUT) as http, http.post(
        url + "/v1/chat/completions", json=payload, headers=headers or {}
    ) as resp:
        raw = await resp.read()
        answer = Answer(resp.status, {k.lower(): v for k, v in resp.headers.items()})
        if resp.content_type == "text/event-stream":
            for line in raw.decode().splitlines():
                if line.startswith("data: "):
                    data = line[len("data: "):]
                    answer.events.append(data if data == "[DONE]" else orjson.loads(data))
        else:
            answer.json = orjson.loads(raw) if raw else None
        return answer


def replica_for(answer: Answer, replicas: list[VllmReplica]) -> VllmReplica:
    """The replica that answered, from ``x-mmgate-backend`` (``vllm-0`` is the first --backend)."""
    name = answer.headers["x-mmgate-backend"]
    return replicas[int(name.rsplit("-", 1)[1])]
