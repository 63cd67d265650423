"""The Grafana dashboard's queries and the metric names they read (shared by its tests)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "mmgate.json"
_METRIC = re.compile(r"\b(mmgate_[a-z_]+|vllm:[a-z_]+)")


def panels() -> list[dict[str, Any]]:
    """Every panel that draws something (rows left out)."""
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def names_in(expr: str) -> set[str]:
    return set(_METRIC.findall(expr))


def exported(page: str) -> set[str]:
    """Every sample name a Prometheus page carries (``_total``, ``_bucket``, ... included)."""
    return {sample.name for family in text_string_to_metric_families(page) for sample in family.samples}
