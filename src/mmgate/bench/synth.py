"""Synthetic sliding-window sessions: N sessions x T turns, each turn showing the last W images
(or, with ``media="video"``, the last W short clips).

This is how a computer-use agent talks to a VLM: every turn resends the latest W screenshots, of
which only ``new_per_turn`` are new. ``single_turn`` output (the default) writes one self-contained
line per turn — exactly W images each — with a shared ``session_id``; ``multi_turn`` output writes
one conversation per session whose first turn carries W images and every later turn its new ones
(the conversation history then keeps them all). Images are distinct, deterministic (seeded)
"screenshots" written as JPEG or PNG files next to the JSONL, referenced by relative paths; clips
are MP4 files (``mmgate.bench.videos.make_clip``, a few milliseconds each), made here, before
anything is timed, and named in ``videos`` / ``video_uuids``.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import orjson
from PIL import Image, ImageDraw

from mmgate.bench.dataset import DatasetType, MediaKind
from mmgate.bench.videos import make_clip

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
    media: MediaKind = "image"
    clip_frames: int = 8
    clip_fps: int = 4

    def validate(self) -> None:
        for name in ("sessions", "turns", "window", "image_size", "new_per_turn"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if self.new_per_turn > self.window:
            raise ValueError("--new-per-turn cannot exceed --window")
        if self.image_size > 8192:
            raise ValueError("--image-size must be at most 8192")
        if self.media == "video":
            if self.image_size % 2 or self.image_size < 16 or self.image_size > 1024:
                raise ValueError("--image-size of a clip must be even, from 16 to 1024")
            if not 1 <= self.clip_frames <= 256 or not 1 <= self.clip_fps <= 60:
                raise ValueError("--clip-frames must be 1..256 and --clip-fps 1..60")


@dataclass(frozen=True, slots=True)
class GeneratedDataset:
    """Where the dataset went and what it holds."""

    path: Path
    dataset_type: DatasetType
    sessions: int
    requests: int
    images: int
    image_bytes: int
    media: MediaKind = "image"
    make_seconds: float = 0.0  # spent making the images or clips


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


def _write_media(spec: SlidingWindowSpec, out: Path) -> tuple[dict[tuple[int, int], str], int]:
    """Every session's images or clips, written once: their relative names and total bytes."""
    video = spec.media == "video"
    folder = "videos" if video else "images"
    (out / folder).mkdir(parents=True, exist_ok=True)
    ext = "mp4" if video else "jpg" if spec.image_format == "jpeg" else "png"
    total_bytes = 0
    names: dict[tuple[int, int], str] = {}
    for s in range(spec.sessions):
        for i in range(images_per_session(spec)):
            name = f"{folder}/s{s:04d}_{i:04d}.{ext}"
            if video:
                (out / name).write_bytes(make_clip(spec.image_size, spec.clip_frames, spec.clip_fps,
                                                   f"{spec.seed}/{s}/{i}"))
            else:
                picture = draw_screenshot(spec.image_size, s, i, spec.seed)
                if spec.image_format == "jpeg":
                    picture.save(out / name, "JPEG", quality=spec.jpeg_quality)
                else:
                    picture.save(out / name, "PNG", optimize=False)
            total_bytes += (out / name).stat().st_size
            names[s, i] = name
    return names, total_bytes


def generate_sliding_window(spec: SlidingWindowSpec, out_dir: Path | str) -> GeneratedDataset:
    """Write ``images/`` (or ``videos/``) and ``sliding_window[_multi_turn].jsonl`` under ``out_dir``."""
    spec.validate()
    out = Path(out_dir)
    started = time.perf_counter()
    names, total_bytes = _write_media(spec, out)
    make_seconds = time.perf_counter() - started
    field, noun, tag = ("videos", "clip", "vid") if spec.media == "video" else ("images", "screenshot", "img")
    suffix = "" if spec.dataset_type == "single_turn" else "_multi_turn"
    path = out / f"sliding_window{suffix}.jsonl"
    lines: list[bytes] = []
    for s in range(spec.sessions):
        sid = f"sw-{s:04d}"
        turns = []
        for t in range(spec.turns):
            shown = window_at(spec, t) if spec.dataset_type == "single_turn" else new_at(spec, t)
            row: dict[str, object] = {
                "text": f"Turn {t + 1} of {spec.turns}: what changed in the newest {noun}?",
                field: [names[s, i] for i in shown],
            }
            if spec.author_uuids:
                row[f"{spec.media}_uuids"] = [f"{sid}-{tag}-{i:04d}" for i in shown]
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
    return GeneratedDataset(path, spec.dataset_type, spec.sessions, spec.sessions * spec.turns, len(names),
                            total_bytes, spec.media, make_seconds)
