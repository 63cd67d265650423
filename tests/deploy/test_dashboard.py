"""The Grafana dashboard (deploy/grafana/mmgate.json) against what operators scrape and alert on:
its job variables are read from the scrape (a fixed job name matches only one scrape setup), every
query filters by them, every alert of docs/OPERATIONS.md has a panel drawing its metrics, the fleet's
moving parts (discovery, ejections, routing sync, shared cache, reloads) each have one, and
every ``mmgate_`` name a panel reads is one the code declares. Whether a real gateway exports them is
tests/observe/test_dashboard.py's question."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.deploy.manifests import ROOT

DASHBOARD = ROOT / "deploy" / "grafana" / "mmgate.json"
OPERATIONS = ROOT / "docs" / "OPERATIONS.md"
METRIC = re.compile(r"\b(mmgate_[a-z_]+|vllm:[a-z_]+)")
UP = re.compile(r"\b(up)\{")  # Prometheus' own: 1 while a target answers its scrape
SUFFIXES = ("_total", "_bucket", "_count", "_sum")
FLEET_PARTS = {
    "discovery": "mmgate_backend_discovery_failures_total",
    "ejections": "mmgate_backend_ejections_total",
    "routing sync": "mmgate_routing_sync_messages_total",
    "shared cache": "mmgate_shared_cache_get_seconds_count",
    "reloads": "mmgate_reloads_total",
}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def drawn() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def exprs() -> list[str]:
    return [t["expr"] for p in drawn() for t in p["targets"]]


def family(name: str) -> str:
    """A sample name's metric family: ``mmgate_x_total`` → ``mmgate_x``."""
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def alert_expressions() -> dict[str, str]:
    """docs/OPERATIONS.md's "What to alert on" table: alert → its expression cell."""
    text = OPERATIONS.read_text()
    table = text[text.index("### What to alert on"):].split("\n## ", 1)[0]
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ") and "`" in line]
    return {row[0].lstrip("| ").strip(): row[1] for row in rows}


def declared_metrics() -> set[str]:
    """Every mmgate_ metric family the code declares (the first argument of a Counter, Gauge or
    Histogram, or of a metric family built at scrape time), whether or not a test gateway ever
    counts it."""
    names: set[str] = set()
    for path in (ROOT / "src" / "mmgate").rglob("*.py"):
        for name in re.findall(r'(?:Counter|Gauge|Histogram)(?:MetricFamily)?\(\s*"(mmgate_[a-z_]+)"', path.read_text()):
            names.add(family(name))
    return names


def test_job_variables_are_read_from_the_scrape() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    for name, metric in (("gateway_job", "mmgate_"), ("vllm_job", "vllm:")):
        variable = variables[name]
        assert variable["type"] == "query", f"{name} is {variable['type']}: a fixed job name"
        query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        assert re.fullmatch(rf"label_values\({re.escape(metric)}[a-z_]+, job\)", query), query
        assert variable["refresh"] in (1, 2)  # asked again on load, not frozen at save time


def test_every_query_filters_by_its_job_variable() -> None:
    for expr in exprs():
        for name in METRIC.findall(expr):
            want = "$gateway_job" if name.startswith("mmgate_") else "$vllm_job"
            assert re.search(re.escape(name) + r'\{job=~"' + re.escape(want) + '"', expr), expr
        for selector in re.findall(r"\bup\{[^}]*\}", expr):
            assert '"$gateway_job"' in selector or '"$vllm_job"' in selector, expr


def test_every_alert_has_a_panel() -> None:
    alerts = alert_expressions()
    assert len(alerts) >= 10
    on_panels = {family(n) for e in exprs() for n in [*METRIC.findall(e), *UP.findall(e)]}
    for alert, expr in alerts.items():
        wanted = {family(n) for n in [*METRIC.findall(expr), *UP.findall(expr)] if not n.startswith("vllm:")}
        assert wanted, f"alert {alert!r} names no gateway metric"
        assert wanted <= on_panels, f"alert {alert!r}: no panel draws {sorted(wanted - on_panels)}"


def test_the_fleets_moving_parts_have_panels() -> None:
    read = {n for e in exprs() for n in METRIC.findall(e)}
    assert {part: metric for part, metric in FLEET_PARTS.items() if metric not in read} == {}
    assert any(re.search(r"\bup\{", e) for e in exprs())  # gateways scraped (down, or waiting for a backend)


def test_every_panel_reads_a_declared_metric() -> None:
    declared = declared_metrics()
    assert {"mmgate_backend_ejections", "mmgate_reloads", "mmgate_shared_cache_get_seconds"} <= declared
    read = {family(n) for e in exprs() for n in METRIC.findall(e) if n.startswith("mmgate_")}
    assert read - declared == set()


def test_panels_have_unique_ids_and_fit_the_grid() -> None:
    panels = dashboard()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    assert all(p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 for p in panels)
    cells: set[tuple[int, int]] = set()
    for p in drawn():
        g = p["gridPos"]
        area = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & area, f"panel {p['title']!r} overlaps another"
        cells |= area
