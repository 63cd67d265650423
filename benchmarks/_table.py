"""The console tables the benchmarks print: one column spec, one renderer, and the statistics they
all quote (a percentile, an interval for paired ratios), so every script's table reads the same way."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Column:
    """One column: its title, its width, how a row's cell is written, left- or right-aligned."""

    title: str
    width: int
    cell: Callable[[Row], str]
    left: bool = False

    def pad(self, text: str) -> str:
        return f"{text:<{self.width}}" if self.left else f"{text:>{self.width}}"


def render(columns: Sequence[Column], rows: Sequence[Row]) -> str:
    """The header line and one line per row."""
    lines = ["".join(c.pad(c.title) for c in columns)]
    lines += ["".join(c.pad(c.cell(r)) for c in columns) for r in rows]
    return "\n".join(lines)


def print_table(columns: Sequence[Column], rows: Sequence[Row]) -> None:
    print(render(columns, rows))


def pct(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank, from below); NaN for no values."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))] if ordered else float("nan")


# Two-sided 90% quantiles of Student's t, by degrees of freedom (1-10); past 10, 1.8 errs wide.
_T90 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812)


def ratio_interval(ratios: Sequence[float]) -> tuple[float, float, float] | None:
    """Geometric mean of paired ratios and its 90% confidence interval (Student's t on their
    logarithms: a ratio's noise is multiplicative); None below two ratios."""
    if len(ratios) < 2 or min(ratios) <= 0:
        return None
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    half = _T90[min(len(logs) - 2, len(_T90) - 1)] * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def fmt_interval(ci: Sequence[float] | None, mark: str = "") -> str:
    """``ratio_interval``'s result as "mean [low-high]" (``mark`` after it), "-" for None."""
    return "-" if ci is None else f"{ci[0]:.2f} [{ci[1]:.2f}-{ci[2]:.2f}]{mark}"
