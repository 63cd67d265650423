"""One streamed chat completion as a benchmark client times it: its status, the time to its first
event that carries output (TTFT) and the whole time."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp

# What a chat chunk with generated text holds (``"content":""`` too: the first chunk of a stream).
CONTENT = b'"content":"'


@dataclass(frozen=True)
class Streamed:
    status: int
    ttft_s: float  # to the first ``data: {`` event holding the marker; the whole time if none came
    total_s: float
    error_body: bytes  # the body of an answer that is not 200; b"" for a 200


async def post_streamed(http: aiohttp.ClientSession, url: str, body: bytes, headers: Mapping[str, str],
                        marker: bytes = CONTENT) -> Streamed:
    """POST ``body`` to ``url`` and read the SSE stream to its end; ``marker=b""``: any event counts."""
    started = time.perf_counter()
    ttft = None
    async with http.post(url, data=body, headers=headers) as r:
        if r.status != 200:
            error = await r.read()
            return Streamed(r.status, time.perf_counter() - started, time.perf_counter() - started, error)
        async for line in r.content:
            if ttft is None and line.startswith(b"data: {") and marker in line:
                ttft = time.perf_counter() - started
    total = time.perf_counter() - started
    return Streamed(200, total if ttft is None else ttft, total, b"")
