"""What the engines behind the endpoint did, from their own Prometheus ``/metrics`` (``--engine-metrics``).

vLLM counts its multimodal processor cache per item (image or video): ``vllm:mm_cache_queries_total``
and ``vllm:mm_cache_hits_total``; its HTTP layer (prometheus-fastapi-instrumentator) sums the
``Content-Length`` of the requests it received in ``http_request_size_bytes_sum``. Read before and
after the measured phase (and around each request when one is in flight at a time), the
differences say how many media parts the engines processed again and how many bytes reached them —
through a gateway too, where the client cannot see what was forwarded. Several engines: summed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from mmgate.bench.errors import BenchError

_METRICS = ("vllm:mm_cache_queries_total", "vllm:mm_cache_hits_total", "http_request_size_bytes_sum")
_LINE = re.compile(
    r"^(" + "|".join(re.escape(m) for m in _METRICS) + r")(?:\{[^}]*\})?\s+([-+0-9.eE]+|NaN)\s*$", re.MULTILINE
)
_MAX_BODY = 8 << 20


@dataclass(frozen=True, slots=True)
class EngineCounters:
    """Counters summed over the engines (totals since they started, or a difference of two reads)."""

    cache_queries: int = 0
    cache_hits: int = 0
    request_bytes: int = 0

    def __sub__(self, other: EngineCounters) -> EngineCounters:
        return EngineCounters(self.cache_queries - other.cache_queries, self.cache_hits - other.cache_hits,
                              self.request_bytes - other.request_bytes)


def parse_counters(text: str) -> EngineCounters:
    """The three counters of one Prometheus text page (label sets summed; absent: 0)."""
    values = dict.fromkeys(_METRICS, 0.0)
    for name, value in _LINE.findall(text):
        if value != "NaN":
            values[name] += float(value)
    return EngineCounters(*(round(values[m]) for m in _METRICS))


def metrics_url(url: str) -> str:
    """``URL/metrics`` unless ``url`` already names the page."""
    base = url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise BenchError(f"--engine-metrics must start with http:// or https://, got {url!r}", param="--engine-metrics")
    return base if base.endswith("/metrics") else base + "/metrics"


class EngineMetrics:
    """Reads the engines' counters; its own HTTP session (the endpoint's API key is not sent to them).
    Use as an async context manager."""

    def __init__(self, urls: Sequence[str], timeout_s: float = 10.0) -> None:
        self.urls = [metrics_url(u) for u in urls]
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session_: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> EngineMetrics:
        self._session_ = aiohttp.ClientSession(timeout=self._timeout)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session_ is not None:
            await self._session_.close()
            self._session_ = None

    @property
    def _session(self) -> aiohttp.ClientSession:
        if self._session_ is None:
            raise RuntimeError("EngineMetrics used outside 'async with'")
        return self._session_

    async def read(self) -> EngineCounters:
        total = EngineCounters()
        for url in self.urls:
            try:
                async with self._session.get(url, headers={"Accept": "text/plain"}) as resp:
                    if resp.status != 200:
                        raise BenchError(f"GET {url} answered {resp.status}", param="--engine-metrics")
                    # The whole page: its counters come last, often in a later chunk than the first.
                    body = bytearray()
                    while chunk := await resp.content.readany():
                        body += chunk
                        if len(body) > _MAX_BODY:
                            raise BenchError(f"GET {url}: a page over {_MAX_BODY} bytes", param="--engine-metrics")
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                raise BenchError(f"cannot read {url}: {exc or type(exc).__name__}", param="--engine-metrics") from exc
            counters = parse_counters(body.decode("utf-8", "replace"))
            total = EngineCounters(total.cache_queries + counters.cache_queries,
                                   total.cache_hits + counters.cache_hits,
                                   total.request_bytes + counters.request_bytes)
        return total
