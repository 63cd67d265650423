"""The console tables the benchmarks print: one column spec, one renderer, and the percentile they
all quote (so every script's table reads the same way)."""

from __future__ import annotations

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
