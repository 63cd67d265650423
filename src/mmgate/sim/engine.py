"""The sim's engine: admits a chat request the way vLLM's front end does.

Order of work, as in vLLM: load every image's bytes (decode ``data:`` URLs, fetch http(s) URLs),
key each image by its uuid or content hash, query the processor cache for all of them, fail with
vLLM's cache-miss error at the first cache-only reference that is not cached, then run the
processor (decode, resize, normalise) on the misses and cache the results. Like vLLM, a cache-only
reference is checked against the cache *before* this request's own images are inserted, so
``[{url, uuid:u}, {uuid:u}]`` in one request fails when ``u`` was not cached before.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import orjson

from mmgate.sim.cache import ProcessedImage, ProcessorCache
from mmgate.sim.config import SimSettings
from mmgate.sim.errors import InvalidRequestError
from mmgate.sim.fetch import data_url_payload, fetch_image
from mmgate.sim.generation import (
    GenerationPlan,
    count_prompt_bytes_tokens,
    count_prompt_text_tokens,
    decode_seconds_per_token,
    plan_generation,
    prefill_seconds,
    prompt_seed,
    stopped,
)
from mmgate.sim.metrics import SimMetrics
from mmgate.sim.processor import content_hash, decode_image, process_image
from mmgate.sim.request import ImageRef, SimRequest, parse_sim_request, with_param
from mmgate.sim.response_store import ResponseStore
from mmgate.vllm_protocol import cache_miss_message

T = TypeVar("T")

# data: URLs longer than this are decoded (and hashed) in the thread pool, not on the loop.
INLINE_DECODE_LIMIT = 256 * 1024


async def sleep_until(deadline: float) -> None:
    """Wait until the event loop's time is ``deadline`` (a modelled time)."""
    delay = deadline - asyncio.get_running_loop().time()
    if delay > 0:
        await asyncio.sleep(delay)


def cache_miss_error(index: int) -> InvalidRequestError:
    """vLLM's error for a cache-only reference that is not cached (``index`` counts images)."""
    return InvalidRequestError(cache_miss_message(index))


@dataclass(frozen=True, slots=True)
class LoadedImage:
    """One image of the request with its cache key; ``data`` None for a cache-only reference."""

    ref: ImageRef
    data: bytes | None
    key: str


@dataclass(frozen=True, slots=True)
class Admitted:
    """A validated request with its token counts, its answer and its modelled timings."""

    request: SimRequest
    text_tokens: int
    image_tokens: int
    max_tokens: int
    plans: tuple[GenerationPlan, ...]  # one per choice (``n``)
    prefill_s: float
    decode_s: float

    @property
    def plan(self) -> GenerationPlan:
        return self.plans[0]

    @property
    def prompt_tokens(self) -> int:
        return self.text_tokens + self.image_tokens

    @property
    def completion_tokens(self) -> int:
        """Tokens generated over every choice (what usage reports)."""
        return sum(len(p.tokens) for p in self.plans)

    @property
    def longest(self) -> int:
        """The longest choice: the choices decode together, as in one vLLM batch."""
        return max(len(p.tokens) for p in self.plans)


class SimEngine:
    """One vLLM-like engine: processor cache, thread pool, HTTP client for image URLs, counters."""

    def __init__(self, settings: SimSettings) -> None:
        self.settings = settings
        self.cache = ProcessorCache(settings.cache_capacity_bytes)
        self.metrics = SimMetrics(settings.model)
        self._executor = ThreadPoolExecutor(
            max_workers=settings.processor_workers, thread_name_prefix="mmgate-sim"
        )
        self._session: aiohttp.ClientSession | None = None
        # Cache queries (hit or not) of processed requests, published when one is admitted.
        self._unpublished: list[bool] = []
        # With serial prefill: when the engine's last admitted prefill ends (event-loop time).
        self._prefill_free_at = 0.0
        # Chat requests the HTTP front holds (GET /load, with enable_server_load_tracking).
        self.server_load = 0
        # Stored Responses API responses (--responses-store-mb); None: none, as vLLM by default.
        self.stored = ResponseStore(settings.responses_store_bytes) if settings.responses_store_bytes else None
        # One request's cache lookups and processing at a time, as vLLM's renderer runs them on a
        # single-worker executor (``vllm/renderers/base.py``, ``_mm_executor``): a request showing an
        # image that another is processing waits and hits the cache instead of processing it again.
        self._mm_lock = asyncio.Lock()

    def first_token_at(self, arrived: float, prefill_s: float) -> float:
        """When a request that arrived at ``arrived`` (loop time) gets its first token. With
        ``serial_prefill`` the prefills of concurrent requests take turns, as on a CPU where one
        engine step uses every core; otherwise each runs as if alone."""
        if not self.settings.serial_prefill:
            return arrived + prefill_s
        start = max(arrived, self._prefill_free_at)
        self._prefill_free_at = start + prefill_s
        return self._prefill_free_at

    def disconnected(self, sent: int) -> None:
        """Count a stream whose client went away after ``sent`` tokens."""
        self.metrics.tokens(0, sent)
        self.metrics.request("disconnected")

    async def close(self) -> None:
        if self.stored is not None:
            await self.stored.close()
        if self._session is not None:
            await self._session.close()
            self._session = None
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=64),
                timeout=aiohttp.ClientTimeout(total=self.settings.fetch_timeout_s),
            )
        return self._session

    async def admit(self, raw_body: bytes) -> Admitted:
        """Parse, validate and preprocess a request; raise sim errors (4xx) for bad input."""
        try:
            body = orjson.loads(raw_body)
        except orjson.JSONDecodeError as exc:
            raise InvalidRequestError(f"Invalid JSON in request body: {exc}.") from exc
        return await self.admit_body(body)

    async def admit_body(self, body: Any) -> Admitted:
        """``admit`` for a request already parsed (the Responses API's, mapped onto chat)."""
        request = parse_sim_request(body, self.settings)
        loaded = [await self._load(ref) for ref in request.images]
        processed, missed_tokens = await self._preprocess(loaded)
        admitted = self._plan(request, loaded, processed, missed_tokens)
        # vLLM publishes its processor-cache stats with the engine's next step: a request that
        # fails after processing (too long) shows its queries with the next admitted request.
        for hit in self._unpublished:
            self.metrics.cache_query(hit)
        self._unpublished.clear()
        return admitted

    async def _load(self, ref: ImageRef) -> LoadedImage:
        if ref.url is None:
            assert ref.uuid is not None  # parse_sim_request guarantees url or uuid
            return LoadedImage(ref=ref, data=None, key=ref.uuid)
        max_bytes = self.settings.max_image_bytes
        if ref.url[:5].lower() == "data:":
            if len(ref.url) > INLINE_DECODE_LIMIT:
                data = await self._run(data_url_payload, ref.url, max_bytes)
            else:
                data = data_url_payload(ref.url, max_bytes)
        else:
            data = await fetch_image(self._http(), ref.url, max_bytes=max_bytes,
                                     timeout_s=self.settings.fetch_timeout_s)
        self.metrics.image_received(len(data))
        if ref.uuid is not None:
            key = ref.uuid
        elif len(data) > INLINE_DECODE_LIMIT:
            key = await self._run(content_hash, data)
        else:
            key = content_hash(data)
        return LoadedImage(ref=ref, data=data, key=key)

    async def _preprocess(self, loaded: list[LoadedImage]) -> tuple[list[ProcessedImage], int]:
        """The processed images, and the image tokens of those processed here (cache misses);
        one request at a time (see ``_mm_lock``)."""
        async with self._mm_lock:
            return await self._preprocess_locked(loaded)

    async def _preprocess_locked(self, loaded: list[LoadedImage]) -> tuple[list[ProcessedImage], int]:
        cache = self.cache
        enabled = cache.capacity_bytes > 0
        found: list[ProcessedImage | None] = []
        for item in loaded:  # query every item first, as vLLM does
            found.append(cache.get(item.key) if enabled else None)
        if self.settings.decode_on_hit:
            # vLLM's chat parser decodes every image it was sent before the processor looks the
            # cache up: bad bytes fail the request even under a cached uuid.
            for item, entry in zip(loaded, found, strict=True):
                if entry is not None and item.data is not None:
                    await self._run(decode_image, item.data, self.settings)
                    self.metrics.image_decoded_on_hit()
        for item, entry in zip(loaded, found, strict=True):
            if entry is None and item.data is None:
                raise cache_miss_error(item.ref.index)
        results: list[ProcessedImage] = []
        misses: list[tuple[str, ProcessedImage]] = []
        for item, entry in zip(loaded, found, strict=True):
            if entry is None:
                assert item.data is not None  # checked above
                entry = await self._run(process_image, item.data, self.settings)
                self.metrics.image_processed()
                misses.append((item.key, entry))
            results.append(entry)
        if enabled:
            # vLLM counts a request's queries only once its processing succeeded: a request that
            # fails (a cache miss without data, bad bytes) moves no counter.
            self._unpublished.extend(entry is not None for entry in found)
            for key, entry in misses:
                cache.put(key, entry)
            self.metrics.cache_state(cache.num_cached_bytes, len(cache), cache.num_evictions)
        return results, sum(entry.num_tokens for _, entry in misses)

    def _plan(self, request: SimRequest, loaded: list[LoadedImage],
              processed: list[ProcessedImage], missed_tokens: int) -> Admitted:
        s = self.settings
        if s.text_tokens == "bytes":
            text_tokens = count_prompt_bytes_tokens(request.roles, request.text_bytes)
        else:
            text_tokens = count_prompt_text_tokens(request.texts, request.num_messages)
        image_tokens = sum(p.num_tokens + s.vision_marker_tokens for p in processed)
        prompt_tokens = text_tokens + image_tokens
        if request.max_tokens is not None and request.max_tokens > s.max_model_len:
            raise InvalidRequestError(
                with_param(f"max_tokens={request.max_tokens} cannot be greater than max_model_len="
                           f"{s.max_model_len}. Please request fewer output tokens.", "max_tokens",
                           request.max_tokens),
                param="max_tokens",
            )
        if prompt_tokens > s.max_model_len:  # vLLM 0.32's words (a prompt of images; text says more)
            raise InvalidRequestError(
                f"Input length ({prompt_tokens}) exceeds model's maximum context length ({s.max_model_len})."
            )
        max_tokens = request.max_tokens
        if max_tokens is None:
            max_tokens = min(s.default_max_tokens, s.max_model_len - prompt_tokens)
        # vLLM 0.32 clips max_tokens to the context left after the prompt (no error).
        max_tokens = min(max_tokens, s.max_model_len - prompt_tokens)
        seed = prompt_seed(request.texts, (item.key for item in loaded))
        least = min(request.min_tokens, max_tokens)
        plans = tuple(
            stopped(plan_generation(seed + i, max_tokens=max_tokens, min_tokens=least, ignore_eos=request.ignore_eos),
                    request.stop, least)
            for i in range(request.n)
        )
        return Admitted(
            request=request,
            text_tokens=text_tokens,
            image_tokens=image_tokens,
            max_tokens=max_tokens,
            plans=plans,
            prefill_s=prefill_seconds(
                text_tokens, image_tokens, s, missed_image_tokens=missed_tokens,
                sent_image_tokens=sum(p.num_tokens for item, p in zip(loaded, processed, strict=True)
                                      if item.data is not None)),
            decode_s=decode_seconds_per_token(s),
        )
