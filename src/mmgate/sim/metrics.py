"""Counters of one sim engine: in-process ``SimStats`` and Prometheus metrics in its own registry.

vLLM's own names are used where vLLM has the metric (``vllm:mm_cache_queries``,
``vllm:mm_cache_hits``, ``vllm:prompt_tokens``, ``vllm:generation_tokens``,
``vllm:request_success``, ``vllm:num_requests_running``, ``vllm:num_requests_waiting``), labelled
``model_name`` and ``engine`` like vLLM's. The sim has no scheduler queue, so
``waiting`` stays 0 and ``running`` counts a request from the end of its image processing to its
last token (with ``--serial-prefill`` that includes the wait for its prefill's turn); sim-only metrics carry the ``mmgate_sim_`` prefix. One registry per engine, so
several engines live in one process.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from mmgate.vllm_protocol import RUNNING_GAUGE, WAITING_GAUGE


@dataclass(slots=True)
class SimStats:
    """Plain counters for tests and for the process that embeds the engine."""

    requests: int = 0
    cache_queries: int = 0
    cache_hits: int = 0
    cache_evictions: int = 0
    images_processed: int = 0
    images_decoded_on_hit: int = 0
    image_bytes_received: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0


class SimMetrics:
    """Updates ``stats`` and the Prometheus series together."""

    def __init__(self, model: str, engine: str = "0") -> None:
        self.stats = SimStats()
        self.registry = CollectorRegistry()
        labels = ("model_name", "engine")
        values = (model, engine)
        r = self.registry
        self._mm_queries = Counter(
            "vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items.",
            labels, registry=r).labels(*values)
        self._mm_hits = Counter(
            "vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.",
            labels, registry=r).labels(*values)
        self._prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=r
        ).labels(*values)
        self._generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", labels, registry=r
        ).labels(*values)
        self._success = Counter(
            "vllm:request_success", "Count of successfully processed requests.",
            (*labels, "finished_reason"), registry=r)
        self._running = Gauge(
            RUNNING_GAUGE, "Number of requests in model execution batches.", labels, registry=r
        ).labels(*values)
        self._waiting = Gauge(
            WAITING_GAUGE, "Number of requests waiting to be processed.", labels, registry=r
        ).labels(*values)
        self._waiting.set(0)
        self._labels = values
        self._requests = Counter(
            "mmgate_sim_requests", "Chat completion requests by HTTP status.", ("status",), registry=r)
        self._images_processed = Counter(
            "mmgate_sim_images_processed", "Images decoded, resized and normalised (cache misses).",
            registry=r)
        self._bytes_received = Counter(
            "mmgate_sim_image_bytes_received", "Encoded image bytes received (data URLs and fetches).",
            registry=r)
        self._decoded_on_hit = Counter(
            "mmgate_sim_images_decoded_on_hit",
            "Images sent with data that hit the processor cache but were decoded anyway (as vLLM does).",
            registry=r)
        self._evictions = Counter(
            "mmgate_sim_mm_cache_evictions", "Processed images evicted from the processor cache.",
            registry=r)
        self._cache_bytes = Gauge(
            "mmgate_sim_mm_cache_bytes", "Bytes held by the processor cache.", registry=r)
        self._cache_items = Gauge(
            "mmgate_sim_mm_cache_items", "Items held by the processor cache.", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def request(self, status: int | str) -> None:
        self.stats.requests += 1
        self._requests.labels(str(status)).inc()

    def cache_query(self, hit: bool) -> None:
        self.stats.cache_queries += 1
        self._mm_queries.inc()
        if hit:
            self.stats.cache_hits += 1
            self._mm_hits.inc()

    def cache_state(self, num_bytes: int, num_items: int, evictions: int) -> None:
        new = evictions - self.stats.cache_evictions
        if new > 0:
            self.stats.cache_evictions = evictions
            self._evictions.inc(new)
        self._cache_bytes.set(num_bytes)
        self._cache_items.set(num_items)

    def image_received(self, num_bytes: int) -> None:
        self.stats.image_bytes_received += num_bytes
        self._bytes_received.inc(num_bytes)

    def image_processed(self) -> None:
        self.stats.images_processed += 1
        self._images_processed.inc()

    def image_decoded_on_hit(self) -> None:
        self.stats.images_decoded_on_hit += 1
        self._decoded_on_hit.inc()

    def tokens(self, prompt: int, generation: int) -> None:
        self.stats.prompt_tokens += prompt
        self.stats.generation_tokens += generation
        self._prompt_tokens.inc(prompt)
        self._generation_tokens.inc(generation)

    def success(self, finish_reason: str) -> None:
        self._success.labels(*self._labels, finish_reason).inc()

    def running(self, delta: int) -> None:
        self._running.inc(delta)
