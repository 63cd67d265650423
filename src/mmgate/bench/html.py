"""Self-contained HTML reports: one of a run (``report.html``) and one of a comparison
(``compare.html``). Plots are embedded as base64 PNGs, so a report is one file that can be mailed or
attached to an issue. Every figure sits in a cell whose ``data-key`` names the JSON value it shows
(``metrics.ttft_ms.p50``, ``totals.errors``, ``ratio.ttft_ms.p50``), so a test can check the page
against the JSON. Pure: strings in, a string out.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from mmgate.bench.report import METRIC_LABELS, TOTAL_LABELS

STATS = ("avg", "p50", "p90", "p99")
_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1100px}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0}td,th{padding:.25em .8em;border-bottom:1px solid #ddd}
td.n{text-align:right;font-variant-numeric:tabular-nums}th{text-align:left;background:#f3f3f3}
img{max-width:100%;border:1px solid #eee;margin:.4em 0}.meta{color:#666;font-size:.9em}
"""


def fmt(value: Any) -> str:
    """A number as the report shows it (the test reads it back the same way)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value:
            return "-"
        return f"{value:,.3f}" if abs(value) < 1000 else f"{value:,.0f}"
    return escape(str(value))


def _cell(key: str, value: Any) -> str:
    return f'<td class="n" data-key="{escape(key)}">{fmt(value)}</td>'


def _page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body><h1>{escape(title)}</h1>{body}</body></html>")


def _images(paths: Sequence[Path]) -> str:
    out = []
    for path in paths:
        data = base64.b64encode(path.read_bytes()).decode()
        out.append(f'<img alt="{escape(path.stem)}" src="data:image/png;base64,{data}">')
    return "".join(out)


def run_report(summary: Mapping[str, Any], name: str, plots: Sequence[Path]) -> str:
    """The HTML page of one run."""
    config = summary.get("config") or {}
    meta = (f"<p class='meta'>model {escape(str(summary.get('model')))} · {escape(str(config.get('url')))}"
            f" · API {escape(str(config.get('api', 'chat')))} · {escape(str(summary.get('created')))}</p>")
    rows = ["<tr><th>metric</th>" + "".join(f"<th>{s}</th>" for s in STATS) + "</tr>"]
    for key, label in METRIC_LABELS:
        dist = summary["metrics"].get(key)
        if dist is not None:
            rows.append(f"<tr><td>{escape(label)}</td>"
                        + "".join(_cell(f"metrics.{key}.{s}", dist[s]) for s in STATS) + "</tr>")
    totals = [f"<tr><td>{escape(label)}</td>{_cell(f'totals.{key}', summary['totals'][key])}</tr>"
              for key, label in TOTAL_LABELS]
    body = (meta + "<h2>Latency and sizes</h2><table>" + "".join(rows) + "</table>"
            + "<h2>Totals</h2><table>" + "".join(totals) + "</table>"
            + ("<h2>Plots</h2>" + _images(plots) if plots else ""))
    return _page(f"mmgate bench — {name}", body)


def comparison_report(
    names: tuple[str, str], rows: Sequence[tuple[str, float | None, float | None, float | None]],
    plots: Sequence[Path],
) -> str:
    """The HTML page of a comparison: every metric of A and B, and B/A."""
    a, b = names
    head = f"<tr><th>metric</th><th>A: {escape(a)}</th><th>B: {escape(b)}</th><th>B/A</th></tr>"
    lines = [f"<tr><td>{escape(key)}</td>{_cell(f'a.{key}', va)}{_cell(f'b.{key}', vb)}"
             f"{_cell(f'ratio.{key}', r)}</tr>" for key, va, vb, r in rows]
    body = (_images(plots) + "<table>" + head + "".join(lines) + "</table>")
    return _page(f"mmgate bench — {b} against {a}", body)
