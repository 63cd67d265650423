"""Fixtures of the benchmark tests: the embedded engine (sim) and a recording endpoint.

Everything runs for real on 127.0.0.1: the sim is mmgate's vLLM stand-in, and ``Recorder`` is a
small aiohttp server that keeps every request body the benchmark sent and forwards it to the sim
(or answers by itself), so the tests assert what went over the wire, not just counts.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from mmgate.app_runtime import start_app
from mmgate.bench.synth import SlidingWindowSpec, generate_sliding_window
from mmgate.sim.config import SimSettings
from mmgate.sim.server import SimServer, start_sim


@dataclass
class Seen:
    """One request as the recorder received it."""

    body: dict[str, Any]
    headers: dict[str, str]
    start: float
    end: float = 0.0
    status: int = 0

    @property
    def images(self) -> list[dict[str, Any]]:
        return [
            part
            for message in self.body["messages"]
            if isinstance(message.get("content"), list)
            for part in message["content"]
            if part.get("type") == "image_url"
        ]


Answer = Callable[[int, dict[str, Any]], web.StreamResponse | None]


@dataclass
class Recorder:
    """Records requests, then forwards them to ``upstream`` unless ``answer`` responds itself."""

    upstream: str
    answer: Answer | None = None
    seen: list[Seen] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None
    _http: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        self._http = aiohttp.ClientSession()
        self._runner, port = await start_app(app, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()

    def by_session(self) -> dict[str, list[Seen]]:
        out: dict[str, list[Seen]] = {}
        for s in self.seen:
            out.setdefault(s.headers.get("x-session-id", ""), []).append(s)
        return out

    async def _models(self, request: web.Request) -> web.StreamResponse:
        assert self._http is not None
        async with self._http.get(self.upstream + "/v1/models") as up:
            return web.Response(body=await up.read(), status=up.status, content_type="application/json")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        assert self._http is not None
        raw = await request.read()
        seen = Seen(orjson.loads(raw), {k.lower(): v for k, v in request.headers.items()}, time.monotonic())
        self.seen.append(seen)
        try:
            if self.answer is not None:
                own = self.answer(len(self.seen) - 1, seen.body)
                if own is not None:
                    seen.status = own.status
                    return own
            async with self._http.post(self.upstream + "/v1/chat/completions", data=raw,
                                       headers={"Content-Type": "application/json"}) as up:
                seen.status = up.status
                resp = web.StreamResponse(status=up.status,
                                          headers={"Content-Type": up.headers.get("Content-Type", "")})
                await resp.prepare(request)
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
        finally:
            seen.end = time.monotonic()


@pytest.fixture
async def sim() -> AsyncIterator[SimServer]:
    server = await start_sim(SimSettings(port=0, speedup=1000.0, processor_workers=1))
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def recorder(sim: SimServer) -> AsyncIterator[Recorder]:
    rec = Recorder(sim.url)
    await rec.start()
    try:
        yield rec
    finally:
        await rec.stop()


@pytest.fixture(scope="session")
def sliding_window(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 sessions x 4 turns, window 3, one new 64-pixel JPEG per turn (single_turn JSONL)."""
    out = tmp_path_factory.mktemp("sw")
    spec = SlidingWindowSpec(sessions=3, turns=4, window=3, image_size=64)
    return generate_sliding_window(spec, out).path


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path
