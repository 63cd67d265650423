"""Gateway-level Prometheus metrics (prefix ``mmgate_``), on a registry owned by one gateway.

Components add their own metrics to the same registry (``mmgate.media.metrics``, the shared tier,
reuse). Labels are bounded: routes, status codes, configured backend names, fixed outcomes — never
a URL, uuid, session or key.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from mmgate.metrics_batch import FlushPending, Spread, Tally

CHAT_ROUTE = "/v1/chat/completions"
# The ``route`` label of requests outside the route table (answered 404/405), and of every
# operator endpoint: bounded whatever paths clients send.
UNMATCHED_ROUTE = "unmatched"
OPERATOR_ROUTE = "operator"

# The ``tenant`` label of requests no tenant is known for (no API keys, or refused before one
# was), and of tenants past ``MAX_TENANT_LABELS`` (a key file larger than a dashboard can show).
NO_TENANT = "none"
OTHER_TENANTS = "other"
MAX_TENANT_LABELS = 1000

_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)


class GatewayMetrics:
    """Request, latency and backend metrics of one gateway."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        # Request-path counts kept as plain numbers (``Tally``, ``Spread``), moved into their
        # children when the registry is collected: registered first, so collected first.
        self._pending: list[Tally | Spread] = []
        registry.register(FlushPending(self._pending))
        self.requests = Counter(
            "mmgate_requests", "HTTP requests by route and status", ["route", "status"], registry=registry
        )
        self.request_seconds = Histogram(
            "mmgate_request_duration_seconds", "Request latency (to the last byte)", ["route"],
            buckets=_LATENCY_BUCKETS, registry=registry,
        )
        self.ttft_seconds = Histogram(
            "mmgate_time_to_first_token_seconds", "Time to the first streamed chunk from the backend",
            buckets=_LATENCY_BUCKETS, registry=registry,
        )
        self.backend_requests = Counter(
            "mmgate_backend_requests", "Requests sent to backends by outcome", ["backend", "outcome"],
            registry=registry,
        )
        self.backend_healthy = Gauge(
            "mmgate_backend_healthy", "1 when the backend passes its health checks", ["backend"],
            registry=registry,
        )
        self.backend_outstanding = Gauge(
            "mmgate_backend_outstanding", "Requests in flight to the backend (streams included)", ["backend"],
            registry=registry,
        )
        self.backend_ejections = Counter(
            "mmgate_backend_ejections", "Times the backend was taken out of rotation", ["backend"],
            registry=registry,
        )
        self.images_forwarded = Counter(
            "mmgate_images_forwarded",
            "Images sent to backends by mode: data, reference (client cache-only), stripped (a repeat "
            "the gateway sent as a reference)",
            ["mode"], registry=registry,
        )
        self.reuse_bytes_not_sent = Counter(
            "mmgate_reuse_bytes_not_sent", "Encoded image bytes not sent to backends thanks to strips",
            registry=registry,
        )
        self.reuse_heals = Counter(
            "mmgate_reuse_heals", "Backend cache misses healed by re-sending bytes from the gateway",
            registry=registry,
        )
        self.routing_decisions = Counter(
            "mmgate_routing_decisions",
            "Backend choices by reason: session, image_affinity, load_spill, least_loaded, "
            "round_robin",
            ["reason"], registry=registry,
        )
        self.routing_image_weight = Counter(
            "mmgate_routing_image_weight",
            "Image weight (tokens, else bytes) sent to each backend, by whether this gateway believed the "
            "backend already held it (hit) or not (miss): hit / (hit + miss) is its image-weight hit ratio",
            ["backend", "outcome"], registry=registry,
        )
        self.routing_sync_messages = Counter(
            "mmgate_routing_sync_messages",
            "Routing-sync messages (--routing-sync) by direction (sent, received) and outcome: ok, error "
            "(Redis failed or timed out: its routed requests go with the next message), invalid (refused whole), "
            "dropped (routed requests queued past the bound), forged (not signed with the fleet's secret), "
            "replayed (a signed message heard before), over_budget (its sender's share of the event loop was spent)",
            ["direction", "outcome"], registry=registry,
        )
        self.streams_stalled = Counter(
            "mmgate_streams_stalled",
            "Streamed answers cut because their client read nothing for --stream-stall-timeout",
            registry=registry,
        )
        self.cache_share_refusals = Counter(
            "mmgate_cache_share_refusals",
            "Requests refused (429) because their tenant's new images would take it past its share of a "
            "backend's processor cache while other tenants use it too",
            registry=registry,
        )
        # Per-tenant counts: plain integers on the request path, turned into metric families
        # only when /metrics is scraped (``_TenantCollector``).
        self._tenants: dict[str, TenantCounters] = {}
        registry.register(_TenantCollector(self._tenants))
        # Label children bound once: ``labels()`` costs a lock and a dict lookup per call, and these
        # are on every request. Keys are bounded (HTTP statuses, configured backend names).
        self._route_counts: dict[tuple[str, int], tuple[Tally, Spread]] = {}
        self._route_seconds: dict[str, Spread] = {}
        self._backend_ok: dict[str, Tally] = {}
        self._decisions: dict[str, Tally] = {}
        self._first_chunk = self._spread(self.ttft_seconds)
        self._backend_gauges: set[str] = set()
        self.forwarded_data = self.images_forwarded.labels("data")
        self.forwarded_reference = self.images_forwarded.labels("reference")
        self.forwarded_stripped = self.images_forwarded.labels("stripped")

    def observe(self, route: str, status: int, seconds: float) -> None:
        """Count one request of ``route`` (a route-table path, ``UNMATCHED_ROUTE`` or
        ``OPERATOR_ROUTE``, never a client's raw path) and its latency."""
        bound = self._route_counts.get((route, status))
        if bound is None:
            spread = self._route_seconds.get(route)
            if spread is None:
                spread = self._route_seconds[route] = self._spread(self.request_seconds.labels(route))
            bound = self._route_counts[(route, status)] = (self._tally(self.requests.labels(route, str(status))), spread)
        bound[0].n += 1
        bound[1].observe(seconds)

    def first_chunk(self, seconds: float) -> None:
        """Observe one stream's time to its first chunk (``mmgate_time_to_first_token_seconds``)."""
        self._first_chunk.observe(seconds)

    def backend_ok(self, backend: str) -> None:
        tally = self._backend_ok.get(backend)
        if tally is None:
            tally = self._backend_ok[backend] = self._tally(self.backend_requests.labels(backend, "ok"))
        tally.n += 1

    def routing_decision(self, reason: str) -> None:
        """Count one routing decision (``reason``: one of the policy's bounded ``REASONS``)."""
        tally = self._decisions.get(reason)
        if tally is None:
            tally = self._decisions[reason] = self._tally(self.routing_decisions.labels(reason))
        tally.n += 1

    def _tally(self, child: Any) -> Tally:
        self._pending.append(tally := Tally(child))
        return tally

    def _spread(self, child: Any) -> Spread:
        self._pending.append(spread := Spread(child))
        return spread

    def backend_in_flight(self, backend: str, outstanding: Callable[[], float]) -> None:
        """Have ``backend``'s in-flight gauge read ``outstanding()`` (this gateway's requests) when
        scraped, so a request's start and end set nothing. Bound once per backend (until ``forget_backend``)."""
        if backend in self._backend_gauges:
            return
        self._backend_gauges.add(backend)
        self.backend_outstanding.labels(backend).set_function(outstanding)

    def forget_backend(self, backend: str) -> None:
        """Drop a departed backend's per-backend series, counters too (labels stay bounded by the
        fleet, however often its members come and go)."""
        self._backend_gauges.discard(backend)
        if (tally := self._backend_ok.pop(backend, None)) is not None:
            self._pending.remove(tally)
        for counter, labels in ((self.backend_requests, ("backend", "outcome")), (self.backend_ejections, ("backend",))):
            for values in _label_values(counter, labels, backend):
                with contextlib.suppress(KeyError):  # removed meanwhile: nothing to do
                    counter.remove(*values)
        for gauge in (self.backend_healthy, self.backend_outstanding):
            with contextlib.suppress(KeyError):
                gauge.remove(backend)
        for outcome in ("hit", "miss"):
            with contextlib.suppress(KeyError):
                self.routing_image_weight.remove(backend, outcome)

    def tenant(self, tenant: str | None) -> TenantCounters:
        """The bound counters of ``tenant`` (a name from the API key file, or None)."""
        name = NO_TENANT if tenant is None else tenant
        counters = self._tenants.get(name)
        if counters is None:
            if len(self._tenants) >= MAX_TENANT_LABELS:
                name = OTHER_TENANTS
                counters = self._tenants.get(name)
            if counters is None:
                counters = self._tenants[name] = TenantCounters()
        return counters


def _label_values(counter: Counter, names: tuple[str, ...], backend: str) -> set[tuple[str, ...]]:
    """The label values of ``counter``'s series of ``backend`` (read through its public collect)."""
    return {tuple(sample.labels[n] for n in names) for family in counter.collect() for sample in family.samples
            if sample.labels.get("backend") == backend and sample.name.endswith("_total")}


class _Observed(Protocol):
    @property
    def images(self) -> int: ...

    @property
    def prompt_tokens(self) -> int | None: ...

    @property
    def completion_tokens(self) -> int | None: ...


class TenantCounters:
    """One tenant's counts (``mmgate_tenant_*``), plain integers: the event loop is the only
    writer and a scrape reads them in the same thread."""

    __slots__ = ("bytes_in", "bytes_out", "completion_tokens", "images", "prompt_tokens", "requests")

    def __init__(self) -> None:
        self.requests: dict[int, int] = {}  # by status class: 2 → 2xx
        self.images = self.bytes_in = self.bytes_out = self.prompt_tokens = self.completion_tokens = 0

    def observe(self, record: _Observed, status: int, bytes_in: int, bytes_out: int) -> None:
        """Count one finished request."""
        status_class = status // 100
        self.requests[status_class] = self.requests.get(status_class, 0) + 1
        self.images += record.images
        self.bytes_in += bytes_in
        self.bytes_out += bytes_out
        if record.prompt_tokens is not None:
            self.prompt_tokens += record.prompt_tokens
        if record.completion_tokens is not None:
            self.completion_tokens += record.completion_tokens


class _TenantCollector(Collector):
    """The ``mmgate_tenant_*`` counters, built from ``TenantCounters`` at scrape time."""

    def __init__(self, tenants: dict[str, TenantCounters]) -> None:
        self._tenants = tenants

    def describe(self) -> list[Metric]:
        return []  # names are not checked for clashes at registration; they are unique to this module

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "mmgate_tenant_requests", "Requests by tenant (the API key file's names; 'none' without keys or "
            "before authentication) and status class (2xx, 4xx, 5xx)", labels=["tenant", "status_class"])
        images = CounterMetricFamily("mmgate_tenant_images", "Images requests carried to backends, by tenant",
                                     labels=["tenant"])
        sizes = CounterMetricFamily(
            "mmgate_tenant_bytes", "HTTP bytes by tenant and direction (in: request bodies from the client, "
            "out: everything sent to it)", labels=["tenant", "direction"])
        tokens = CounterMetricFamily(
            "mmgate_tenant_tokens", "Tokens by tenant and kind (prompt, completion), read from the usage the "
            "backends return (whole answers, and streams whose last chunk carries usage)", labels=["tenant", "kind"])
        for name, c in list(self._tenants.items()):
            for status_class, count in sorted(c.requests.items()):
                requests.add_metric([name, f"{status_class}xx"], count)
            images.add_metric([name], c.images)
            sizes.add_metric([name, "in"], c.bytes_in)
            sizes.add_metric([name, "out"], c.bytes_out)
            tokens.add_metric([name, "prompt"], c.prompt_tokens)
            tokens.add_metric([name, "completion"], c.completion_tokens)
        yield from (requests, images, sizes, tokens)
