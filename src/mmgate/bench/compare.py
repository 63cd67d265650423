"""``mmgate bench compare A.json B.json``: every metric of two runs side by side, with B/A."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from mmgate.bench.errors import ResultFileError
from mmgate.bench.report import SUMMARY_FORMAT

_CLIENT_KEYS = ("cpu_percent",)
DEFAULT_STATS = ("avg", "p50", "p90", "p99")


def load_summary(path: Path | str) -> dict[str, Any]:
    """Read a ``summary.json`` (or the directory holding one)."""
    file = Path(path)
    if file.is_dir():
        file = file / "summary.json"
    try:
        data = orjson.loads(file.read_bytes())
    except OSError as exc:
        raise ResultFileError(f"{file}: cannot read: {exc.strerror or exc}") from exc
    except orjson.JSONDecodeError as exc:
        raise ResultFileError(f"{file}: not JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != SUMMARY_FORMAT:
        raise ResultFileError(f"{file}: not an mmgate bench summary (expected format {SUMMARY_FORMAT!r})")
    return data


def flatten(summary: Mapping[str, Any], stats: tuple[str, ...] | None = None) -> dict[str, float]:
    """Numeric leaves: ``<metric>.<stat>``, ``<total>``, ``engine.<name>``, ``client.<name>[.<stat>]``.

    ``stats`` limits the statistics of distributions (None: all but ``count``).
    """
    out: dict[str, float] = {}
    for name, dist in (summary.get("metrics") or {}).items():
        if isinstance(dist, dict):
            for stat, value in dist.items():
                if stats is not None and stat not in stats:
                    continue
                if stat != "count" and isinstance(value, int | float):
                    out[f"{name}.{stat}"] = float(value)
    for name, value in (summary.get("totals") or {}).items():
        if isinstance(value, int | float):
            out[name] = float(value)
    for name, value in (summary.get("engine") or {}).items():  # --engine-metrics
        if isinstance(value, int | float):
            out[f"engine.{name}"] = float(value)
    client = summary.get("client") or {}
    for name in _CLIENT_KEYS:
        if isinstance(client.get(name), int | float):
            out[f"client.{name}"] = float(client[name])
    for name in ("loop_lag_ms", "send_lag_ms"):
        dist = client.get(name)
        if isinstance(dist, dict):
            for stat in ("p50", "p99"):
                out[f"client.{name}.{stat}"] = float(dist[stat])
    return out


def ratio(a: float | None, b: float | None) -> float | None:
    """B/A; None when either is missing or A is 0 (unless both are 0: 1.0)."""
    if a is None or b is None:
        return None
    if a == 0:
        return 1.0 if b == 0 else None
    return b / a


def compare_rows(
    a: Mapping[str, Any], b: Mapping[str, Any], stats: tuple[str, ...] | None = None
) -> list[tuple[str, float | None, float | None, float | None]]:
    """(metric, A, B, B/A) for every metric present in either run, A's order first."""
    fa, fb = flatten(a, stats), flatten(b, stats)
    keys = list(fa) + [k for k in fb if k not in fa]
    return [(k, fa.get(k), fb.get(k), ratio(fa.get(k), fb.get(k))) for k in keys]


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if value == int(value):
        return f"{int(value):,}"
    return f"{value:,.{digits}f}"


def run_name(summary: Mapping[str, Any], path: str) -> str:
    """A run's name: its own (``--name``, or its output folder's), else the path it was read from."""
    name = summary.get("name")
    return str(name) if isinstance(name, str) and name else str(path)


def print_comparison(
    a_path: str, b_path: str, console: Console, all_stats: bool = False, output_dir: Path | None = None
) -> int:
    """Print the comparison table (avg/p50/p90/p99 unless ``all_stats``); with ``output_dir``, also
    write ``compare.json``, ``compare.png`` (B/A of the key metrics) and ``compare.html``. Returns the
    exit status."""
    a, b = load_summary(a_path), load_summary(b_path)
    table = Table(title=f"A = {a_path}\nB = {b_path}", title_justify="left")
    table.add_column("metric")
    table.add_column("A", justify="right")
    table.add_column("B", justify="right")
    table.add_column("B/A", justify="right")
    for key, va, vb, r in compare_rows(a, b, None if all_stats else DEFAULT_STATS):
        table.add_row(key, _fmt(va), _fmt(vb), "-" if r is None else f"{r:.3f}")
    console.print(table)
    if output_dir is not None:
        write_comparison(a, b, (run_name(a, a_path), run_name(b, b_path)), output_dir,
                         None if all_stats else DEFAULT_STATS)
    return 0


def write_comparison(
    a: Mapping[str, Any], b: Mapping[str, Any], names: tuple[str, str], directory: Path,
    stats: tuple[str, ...] | None = DEFAULT_STATS,
) -> list[Path]:
    """``compare.json`` (every row), ``compare.png`` and the self-contained ``compare.html``."""
    from mmgate.bench.html import comparison_report
    from mmgate.bench.plots import write_comparison_plot

    rows = compare_rows(a, b, stats)
    directory.mkdir(parents=True, exist_ok=True)
    written = [directory / "compare.json"]
    written[0].write_bytes(orjson.dumps({"a": names[0], "b": names[1], "rows": [
        {"metric": k, "a": va, "b": vb, "ratio": r} for k, va, vb, r in rows]}, option=orjson.OPT_INDENT_2))
    plot = write_comparison_plot(rows, names, directory / "compare.png")
    plots = [plot] if plot is not None else []
    page = directory / "compare.html"
    page.write_text(comparison_report(names, rows, plots))
    return [*written, *plots, page]
