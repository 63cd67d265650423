"""A steady multi-session image workload with uuid references, spread over gateways as a Kubernetes
Service would (round robin over the gateways currently in its endpoints), recording every outcome.

A session's first turn sends its image with a uuid; every later turn refers to it by uuid only (a
cache-only reference the gateway must serve, healing a backend that lost it), and every
``new_image_every`` turns a new labelled image joins. A client sees a failure as any status but 200
(a cache miss the gateway failed to heal would be a 400) or a transport error.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tests.support.http import CHAT_PATH
from tests.support.images import png_data_url

MODEL = "mmgate-sim-vl"


@dataclass(slots=True)
class Outcome:
    """One request as the client saw it."""

    started: float
    ended: float
    gateway: str
    session: str
    status: int  # 0: a transport error (connection refused or reset)
    backend: str = ""
    healed: int = 0
    error: str = ""


def reuse_counts(header: str) -> dict[str, int]:
    """``sent=1; stripped=0; referenced=2; healed=0`` → a dict."""
    counts: dict[str, int] = {}
    for item in header.split(";"):
        name, _, value = item.strip().partition("=")
        if value.isdigit():
            counts[name] = int(value)
    return counts


@dataclass
class Service:
    """The gateways a client may reach now (a Service's ready endpoints), taken round robin."""

    endpoints: list[str] = field(default_factory=list)
    _next: int = 0

    def pick(self) -> str | None:
        if not self.endpoints:
            return None
        self._next = (self._next + 1) % len(self.endpoints)
        return self.endpoints[self._next]

    def remove(self, url: str) -> None:
        if url in self.endpoints:
            self.endpoints.remove(url)

    def add(self, url: str) -> None:
        if url not in self.endpoints:
            self.endpoints.append(url)


class SessionWorkload:
    """``sessions`` sessions, ``concurrency`` of them talking at once, each turn through the
    Service's next gateway; ``run`` until ``stop`` is set. ``in_flight`` maps each gateway to the
    requests on it now (what a SIGKILL may fail)."""

    def __init__(self, service: Service, *, sessions: int = 24, concurrency: int = 6, max_tokens: int = 16,
                 new_image_every: int = 4, window: int = 4, model: str = MODEL, image_side: int = 64,
                 timeout_s: float = 60.0) -> None:
        self.service = service
        self.sessions = sessions
        self.concurrency = concurrency
        self.max_tokens = max_tokens
        self.new_image_every = new_image_every
        self.window = window
        self.model = model
        self.image_side = image_side
        self.timeout_s = timeout_s
        self.outcomes: list[Outcome] = []
        self.in_flight: Counter[str] = Counter()
        self.turns: Counter[str] = Counter()
        self.stop = asyncio.Event()
        self._http: dict[str, aiohttp.ClientSession] = {}

    def body(self, session: str, turn: int) -> dict[str, Any]:
        """The turn's request: the session's last ``window`` images, a new one with its bytes, the
        others as cache-only references by uuid."""
        images = turn // self.new_image_every + 1
        content: list[dict[str, Any]] = [{"type": "text", "text": f"turn {turn}: what changed?"}]
        for i in range(max(0, images - self.window), images):
            uuid = f"{session}-img{i}"
            fresh = turn % self.new_image_every == 0 and i == images - 1
            seed = zlib.crc32(f"{session}-{i}".encode()) & 0xFFFF
            content.append({"type": "image_url", "uuid": uuid,
                            "image_url": {"url": png_data_url(seed, self.image_side)} if fresh else None})
        return {"model": self.model, "max_tokens": self.max_tokens, "messages": [{"role": "user", "content": content}]}

    def _client(self, gateway: str) -> aiohttp.ClientSession:
        client = self._http.get(gateway)
        if client is None or client.closed:
            client = self._http[gateway] = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        return client

    async def forget(self, gateway: str) -> None:
        """Drop the client's pooled connections to a gateway that went away."""
        client = self._http.pop(gateway, None)
        if client is not None:
            await client.close()

    async def turn(self, session: str) -> Outcome | None:
        gateway = self.service.pick()
        if gateway is None:
            await asyncio.sleep(0.05)
            return None
        turn = self.turns[session]
        started = time.monotonic()
        outcome = Outcome(started, started, gateway, session, 0)
        self.in_flight[gateway] += 1
        try:
            async with self._client(gateway).post(gateway + CHAT_PATH, json=self.body(session, turn),
                                                  headers={"x-session-id": session}) as r:
                data = await r.read()
                outcome.status = r.status
                outcome.backend = r.headers.get("x-mmgate-backend", "")
                outcome.healed = reuse_counts(r.headers.get("x-mmgate-reuse", "")).get("healed", 0)
                if r.status != 200:
                    outcome.error = data[:300].decode(errors="replace")
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:  # the client's view: a failure
            outcome.error = f"{exc.__class__.__name__}: {exc}"
        finally:
            self.in_flight[gateway] -= 1
        outcome.ended = time.monotonic()
        if outcome.status == 200:
            self.turns[session] += 1  # a failed turn is retried as the same turn
        self.outcomes.append(outcome)
        return outcome

    async def long_stream(self, gateway: str, session: str, max_tokens: int, answering: asyncio.Event) -> Outcome:
        """A streamed answer of ``max_tokens`` through ``gateway`` (``answering`` set at its first
        bytes), recorded with the rest: what a gateway killed under it must lose."""
        body = {**self.body(session, 0), "stream": True, "max_tokens": max_tokens}
        started = time.monotonic()
        outcome = Outcome(started, started, gateway, session, 0)
        self.in_flight[gateway] += 1
        try:
            async with self._client(gateway).post(gateway + CHAT_PATH, json=body,
                                                  headers={"x-session-id": session}) as r:
                first = await r.content.readany()
                answering.set()
                data = first + await r.read()  # a stream that came whole in one read ends in ``first``
                complete = data.rstrip().endswith(b"data: [DONE]")
                outcome.status = r.status if complete else 0
                outcome.error = "" if complete else \
                    f"stream ended without [DONE] (status {r.status}, {len(data)} bytes): {data[-200:]!r}"
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:  # the client's view: a failure
            outcome.error = f"{exc.__class__.__name__}: {exc}"
        finally:
            self.in_flight[gateway] -= 1
            answering.set()
        outcome.ended = time.monotonic()
        self.outcomes.append(outcome)
        return outcome

    async def run(self) -> None:
        """Each worker owns every ``concurrency``-th session and talks through them in turn."""

        async def worker(w: int) -> None:
            mine = [f"s{i}" for i in range(w, self.sessions, self.concurrency)]
            k = 0
            while not self.stop.is_set():
                await self.turn(mine[k % len(mine)])
                k += 1

        try:
            await asyncio.gather(*(worker(w) for w in range(self.concurrency)))
        finally:
            await self.close()

    async def close(self) -> None:
        """Close the client's connections."""
        for client in list(self._http.values()):
            with contextlib.suppress(Exception):
                await client.close()
        self._http.clear()

    def failures(self, since: float = 0.0, until: float = float("inf")) -> list[Outcome]:
        return [o for o in self.outcomes if o.status != 200 and since <= o.started <= until]

    def between(self, since: float, until: float) -> list[Outcome]:
        return [o for o in self.outcomes if since <= o.started <= until]
