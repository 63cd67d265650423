"""Synthetic sliding-window sessions: N sessions x T turns, each turn showing the last W images.

This is how a computer-use agent talks to a VLM: every turn resends the latest W screenshots, of
which only ``new_per_turn`` are new. ``single_turn`` output (the default) writes one self-contained
line per turn — exactly W images each — with a shared ``session_id``; ``multi_turn`` output writes
one conversation per session whose first turn carries W images and every later turn its new ones
(the conversation history then keeps them all). Images are distinct, deterministic (seeded)
"screenshots" written as JPEG or PNG files next to the JSONL, referenced by relative paths.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import orjson
from PIL import Image, ImageDraw

from mmgate.bench.dataset import DatasetType

ImageFormat = Literal["jpeg", "png"]


@dataclass(frozen=True, slots=True)
class SlidingWindowSpec:
    """What to generate (the defaults are those of ``mmgate bench dataset sliding-window``)."""

    sessions: int = 8
    turns: int = 10
    window: int = 4
    image_size: int = 512
    image_format: ImageFormat = "jpeg"
    new_per_turn: int = 1
    dataset_type: DatasetType = "single_turn"
    output_length: int | None = None
    delay_ms: float | None = None
    author_uuids: bool = False
    seed: int = 0
    jpeg_quality: int = 85

    def validate(self) -> None:
        for name in ("sessions", "turns", "window", "image_size", "new_per_turn"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if self.new_per_turn > self.window:
            raise ValueError("--new-per-turn cannot exceed --window")
        if self.image_size > 8192:
            raise ValueError("--image-size must be at most 8192")


@dataclass(frozen=True, slots=True)
class GeneratedDataset:
    """Where the dataset went and what it holds."""

    path: Path
    dataset_type: DatasetType
    sessions: int
    requests: int
    images: int
    image_bytes: int


def images_per_session(spec: SlidingWindowSpec) -> int:
    return spec.window + (spec.turns - 1) * spec.new_per_turn


def window_at(spec: SlidingWindowSpec, turn: int) -> range:
    """Indexes (in the session's image sequence) of the images shown at ``turn`` (0-based)."""
    end = spec.window + turn * spec.new_per_turn
    return range(end - spec.window, end)


def new_at(spec: SlidingWindowSpec, turn: int) -> range:
    """Indexes of the images first shown at ``turn``."""
    if turn == 0:
        return range(0, spec.window)
    end = spec.window + turn * spec.new_per_turn
    return range(end - spec.new_per_turn, end)


def draw_screenshot(size: int, session: int, index: int, seed: int) -> Image.Image:
    """A distinct, deterministic screenshot-like picture."""
    rng = random.Random(f"{seed}/{session}/{index}")
    image = Image.new("RGB", (size, size), tuple(rng.randrange(160, 256) for _ in range(3)))
    draw = ImageDraw.Draw(image)
    bar = max(8, size // 16)
    draw.rectangle((0, 0, size, bar), fill=(40, 40, 60))
    for _ in range(12):
        x0, y0 = rng.randrange(size), rng.randrange(bar, size)
        x1, y1 = x0 + rng.randrange(8, max(9, size // 3)), y0 + rng.randrange(8, max(9, size // 4))
        color = tuple(rng.randrange(256) for _ in range(3))
        draw.rectangle((x0, y0, x1, y1), fill=color, outline=(0, 0, 0))
    draw.text((4, 1), f"session {session} screen {index}", fill=(255, 255, 255))
    return image


def generate_sliding_window(spec: SlidingWindowSpec, out_dir: Path | str) -> GeneratedDataset:
    """Write ``images/`` and ``sliding_window[_multi_turn].jsonl`` under ``out_dir``."""
    spec.validate()
    out = Path(out_dir)
    image_dir = out / "images"
    image_dir.mkdir(parents=True, exist_ok=True)
    ext = "jpg" if spec.image_format == "jpeg" else "png"
    total_bytes = 0
    names: dict[tuple[int, int], str] = {}
    for s in range(spec.sessions):
        for i in range(images_per_session(spec)):
            name = f"images/s{s:04d}_{i:04d}.{ext}"
            picture = draw_screenshot(spec.image_size, s, i, spec.seed)
            if spec.image_format == "jpeg":
                picture.save(out / name, "JPEG", quality=spec.jpeg_quality)
            else:
                picture.save(out / name, "PNG", optimize=False)
            total_bytes += (out / name).stat().st_size
            names[s, i] = name
    suffix = "" if spec.dataset_type == "single_turn" else "_multi_turn"
    path = out / f"sliding_window{suffix}.jsonl"
    lines: list[bytes] = []
    for s in range(spec.sessions):
        sid = f"sw-{s:04d}"
        turns = []
        for t in range(spec.turns):
            shown = window_at(spec, t) if spec.dataset_type == "single_turn" else new_at(spec, t)
            row: dict[str, object] = {
                "text": f"Turn {t + 1} of {spec.turns}: what changed in the newest screenshot?",
                "images": [names[s, i] for i in shown],
            }
            if spec.author_uuids:
                row["image_uuids"] = [f"{sid}-img-{i:04d}" for i in shown]
            if spec.output_length is not None:
                row["output_length"] = spec.output_length
            if spec.delay_ms is not None and t > 0:
                row["delay"] = spec.delay_ms
            if spec.dataset_type == "single_turn":
                lines.append(orjson.dumps({"session_id": sid, **row}))
            else:
                turns.append(row)
        if spec.dataset_type == "multi_turn":
            lines.append(orjson.dumps({"session_id": sid, "turns": turns}))
    path.write_bytes(b"\n".join(lines) + b"\n")
    return GeneratedDataset(
        path, spec.dataset_type, spec.sessions, spec.sessions * spec.turns, len(names), total_bytes
    )
