"""What a decode bomb costs with and without the gateway's structure check.

For each bomb (a progressive JPEG with repeated scans, a PNG of empty ancillary chunks) and one
ordinary image of the same size: the wall time of Pillow opening and decoding it as validation
does (``draft`` for JPEG), and of ``mmgate.media.validate.validate_image`` (structure check first:
the bombs are refused before Pillow reads a byte). Medians of ``--repeats``.

    .venv/bin/python benchmarks/decode_bombs.py --out results/decode_bombs.json
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from PIL import Image

from mmgate.errors import UnsupportedImageError
from mmgate.media.validate import validate_image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _procs import ROOT
from _table import Column, render

sys.path.insert(0, str(ROOT))
from tests.support.bombs import many_scans, png, progressive_jpeg

FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP")


def pillow_decode(data: bytes) -> None:
    with Image.open(io.BytesIO(data)) as img:
        if img.format == "JPEG":
            img.draft(img.mode, (max(1, img.width // 8), max(1, img.height // 8)))
        img.load()


def gateway_validate(data: bytes) -> str:
    try:
        validate_image(data, allowed_formats=FORMATS, max_pixels=40_000_000)
    except UnsupportedImageError:
        return "refused (415)"
    return "accepted"


def timed(fn: Callable[[bytes], object], data: bytes, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn(data)
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=ROOT / "results" / "decode_bombs.json")
    args = p.parse_args()
    cases = {
        "jpeg 1000x1000, 11 scans": progressive_jpeg(1000),
        "jpeg 1000x1000, +2000 scans": many_scans(2000, 1000),
        "png 32x32, 10 tEXt chunks": png(ancillary=10),
        "png 32x32, +200k tEXt chunks": png(ancillary=200_000),
        "png 32x32, +800k tEXt chunks": png(ancillary=800_000),
    }
    rows = []
    for name, data in cases.items():
        rows.append({"case": name, "mib": len(data) / 2**20, "pillow_ms": timed(pillow_decode, data, args.repeats),
                     "gateway_ms": timed(gateway_validate, data, args.repeats), "outcome": gateway_validate(data)})
    print(render([Column("case", 30, lambda r: r["case"], left=True), Column("MiB", 8, lambda r: f"{r['mib']:.2f}"),
                  Column("Pillow decode ms", 18, lambda r: f"{r['pillow_ms']:.1f}"),
                  Column("gateway ms", 12, lambda r: f"{r['gateway_ms']:.2f}"),
                  Column("  gateway", 16, lambda r: "  " + r["outcome"], left=True)], rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"repeats": args.repeats, "rows": rows}, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
