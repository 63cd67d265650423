"""PNG plots of a run (matplotlib, Agg backend, no display needed).

* ``ttft.png`` — TTFT distribution (histogram, p50/p99 marked);
* ``latency_over_time.png`` — request latency against send time, errors in red;
* ``bytes_per_turn.png`` — mean request bytes and image bytes actually sent, by turn index: with
  ``--uuid-and-strip`` the curve stays flat where a resending client's grows with the history;
* ``compare.png`` (``mmgate bench compare --output-dir``) — B/A of the key metrics of two runs.

Each plot's title names its run; every axis that carries a size or a ratio starts at zero, so a
few percent of noise never looks like a trend.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np

from mmgate.bench.records import RecordStore

# (key in compare_rows, label) of the comparison plot, top to bottom.
COMPARED: tuple[tuple[str, str], ...] = (
    ("ttft_ms.p50", "TTFT p50"), ("ttft_ms.p99", "TTFT p99"),
    ("request_latency_ms.p50", "latency p50"), ("request_latency_ms.p99", "latency p99"),
    ("request_throughput", "requests/s"), ("output_token_throughput", "output tokens/s"),
    ("images_with_data", "images sent with data"), ("image_bytes_sent", "image bytes sent"),
    ("videos_with_data", "videos sent with data"), ("video_bytes_sent", "video bytes sent"),
    ("request_bytes_sent", "request bytes sent"), ("engine.request_bytes", "bytes the engines received"),
)
HIGHER_IS_BETTER = frozenset({"request_throughput", "output_token_throughput"})
_BETTER, _WORSE, _SAME = "#228833", "#cc3311", "#999999"


def write_plots(store: RecordStore, directory: Path, title: str = "") -> list[Path]:
    """Write the three PNGs; returns their paths (a plot with no data is skipped)."""
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, draw in (("ttft.png", _ttft), ("latency_over_time.png", _latency),
                       ("bytes_per_turn.png", _bytes_per_turn)):
        fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
        try:
            if not draw(store, ax):
                continue
            if title:
                fig.suptitle(title, fontsize=9)
            fig.tight_layout()
            path = directory / name
            fig.savefig(path)
            written.append(path)
        finally:
            plt.close(fig)
    return written


def _ttft(store: RecordStore, ax: plt.Axes) -> bool:
    values = store.ms("ttft_ns")
    if values.size == 0:
        return False
    ax.hist(values, bins=min(80, max(10, values.size // 20)), color="#4477aa")
    for q, style in ((50, "--"), (99, ":")):
        x = float(np.percentile(values, q))
        ax.axvline(x, color="black", linestyle=style, linewidth=1, label=f"p{q} {x:.1f} ms")
    ax.set_xlim(left=0)
    ax.set_xlabel("time to first token (ms)")
    ax.set_ylabel("requests")
    ax.set_title("TTFT distribution")
    ax.legend()
    return True


def _latency(store: RecordStore, ax: plt.Axes) -> bool:
    if len(store) == 0:
        return False
    start = store.column("start_ns") / 1e9
    latency = store.column("latency_ns") / 1e6
    ok = store.ok_mask()
    ax.scatter(start[ok], latency[ok], s=4, alpha=0.5, color="#4477aa", label="ok")
    if (~ok).any():
        ax.scatter(start[~ok], latency[~ok], s=8, color="#cc3311", label="error")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("send time (s since start)")
    ax.set_ylabel("request latency (ms)")
    ax.set_title("Request latency over time")
    ax.legend()
    return True


def _bytes_per_turn(store: RecordStore, ax: plt.Axes) -> bool:
    if len(store) == 0:
        return False
    turns = store.column("turn_index")
    n = int(turns.max()) + 1
    counts = np.bincount(turns, minlength=n)
    seen = counts > 0
    x = np.arange(n)[seen]
    body = np.bincount(turns, weights=store.column("body_bytes"), minlength=n)[seen] / counts[seen]
    images = np.bincount(turns, weights=store.column("image_bytes_sent"), minlength=n)[seen] / counts[seen]
    ax.plot(x, body / 1024, marker="o", markersize=3, label="request bytes")
    videos = np.bincount(turns, weights=store.column("video_bytes_sent"), minlength=n)[seen] / counts[seen]
    if store.totals.logical_images or not store.totals.logical_videos:
        ax.plot(x, images / 1024, marker="s", markersize=3, label="image bytes with data")
    if store.totals.logical_videos:
        ax.plot(x, videos / 1024, marker="^", markersize=3, label="video bytes with data")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("turn index in session")
    ax.set_ylabel("KiB sent per request (mean)")
    ax.set_title("Bytes sent per turn")
    ax.legend()
    return True


def write_comparison_plot(
    rows: list[tuple[str, float | None, float | None, float | None]], names: tuple[str, str], path: Path
) -> Path | None:
    """``compare.png``: B/A of the key metrics as bars from 0, a line at 1, green where B is better,
    red where worse, grey within 2% (None: nothing to draw). A count that is 0 in both runs (videos
    of an image run, images of a video run) is left out."""
    ratios = {key: r for key, a, b, r in rows if r is not None and (a or b)}
    shown = [(label, ratios[key], key in HIGHER_IS_BETTER) for key, label in COMPARED if key in ratios]
    if not shown:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(shown) + 1.6), dpi=110)
    try:
        labels = [label for label, _, _ in shown][::-1]
        values = [value for _, value, _ in shown][::-1]
        colours = [_SAME if abs(v - 1) < 0.02 else _BETTER if (v > 1) == higher else _WORSE
                   for _, v, higher in shown][::-1]
        bars = ax.barh(labels, values, color=colours)
        ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], padding=3, fontsize=8)
        ax.axvline(1.0, color="black", linewidth=1)
        ax.set_xlim(0, max(1.2, max(values) * 1.15))
        ax.set_xlabel(f"B/A  (A = {names[0]}, B = {names[1]})")
        ax.set_title(f"{names[1]} against {names[0]}")
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path
