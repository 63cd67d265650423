"""The request path's counts are kept as plain numbers and moved into their Prometheus children
when the registry is collected: the exposition must equal what plain ``inc``/``observe`` calls give."""

from __future__ import annotations

import math
import os

from prometheus_client import CollectorRegistry, generate_latest

from mmgate.metrics import CHAT_ROUTE, GatewayMetrics
from mmgate.observe.ids import new_request_id

# Exact bucket bounds, between them, zero, past the largest bound.
AMOUNTS = (0.0, 0.0004, 0.001, 0.0011, 0.0025, 0.003, 0.05, 0.5, 1.0, 59.9, 120.0, 120.5, 1e6)


def _exposition(registry: CollectorRegistry) -> list[str]:
    """The text exposition without the ``_created`` samples (creation times differ)."""
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


def _same(batched: CollectorRegistry, plain: CollectorRegistry) -> None:
    """Equal line for line; a histogram's ``_sum`` to the last bits (added in another order)."""
    ours, theirs = _exposition(batched), _exposition(plain)
    assert len(ours) == len(theirs)
    for mine, reference in zip(ours, theirs, strict=True):
        if "_sum{" in mine or "_sum " in mine:
            name, _, value = mine.rpartition(" ")
            assert name == reference.rpartition(" ")[0]
            assert math.isclose(float(value), float(reference.rpartition(" ")[2]), rel_tol=1e-12)
        else:
            assert mine == reference


def _plain(m: GatewayMetrics) -> None:
    for i, amount in enumerate(AMOUNTS):
        status = "200" if i % 3 else "499"
        m.requests.labels(CHAT_ROUTE, status).inc()
        m.request_seconds.labels(CHAT_ROUTE).observe(amount)
        m.ttft_seconds.observe(amount)
        m.backend_requests.labels("b1", "ok").inc()
        m.routing_decisions.labels("affinity").inc()


def _batched(m: GatewayMetrics) -> None:
    for i, amount in enumerate(AMOUNTS):
        m.observe(CHAT_ROUTE, 200 if i % 3 else 499, amount)
        m.first_chunk(amount)
        m.backend_ok("b1")
        m.routing_decision("affinity")


def test_batched_counts_expose_as_plain_calls_do() -> None:
    plain, batched = GatewayMetrics(CollectorRegistry()), GatewayMetrics(CollectorRegistry())
    _plain(plain)
    _batched(batched)
    _same(batched.registry, plain.registry)
    assert batched.registry.get_sample_value("mmgate_requests_total", {"route": CHAT_ROUTE, "status": "200"}) == 8
    # A second round after a scrape: added once, not twice.
    _plain(plain)
    _batched(batched)
    _same(batched.registry, plain.registry)
    assert batched.registry.get_sample_value(
        "mmgate_time_to_first_token_seconds_bucket", {"le": "+Inf"}) == 2 * len(AMOUNTS)


def test_a_forgotten_backend_leaves_no_pending_count() -> None:
    m = GatewayMetrics(CollectorRegistry())
    m.backend_ok("gone")
    m.forget_backend("gone")
    assert m.registry.get_sample_value("mmgate_backend_requests_total", {"backend": "gone", "outcome": "ok"}) is None
    m.backend_ok("gone")  # it came back: counted from zero
    assert m.registry.get_sample_value("mmgate_backend_requests_total", {"backend": "gone", "outcome": "ok"}) == 1


def test_new_request_ids_are_distinct_hex_and_a_forked_child_makes_its_own() -> None:
    ids = [new_request_id() for _ in range(600)]  # more than one urandom read
    assert len(set(ids)) == 600 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id must not be one the parent hands out next
        os.write(write, new_request_id().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    assert len(child) == 32 and child != new_request_id()
