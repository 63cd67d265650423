"""What a decode bomb costs with and without the gateway's structure check, and what costly decodes
that pass it do to another tenant's images.

Part 1: for each bomb (a progressive JPEG with repeated scans, a PNG of empty ancillary chunks) and
one ordinary image of the same size: the wall time of Pillow opening and decoding it as validation
does (``draft`` for JPEG), and of ``mmgate.media.validate.validate_image`` (structure check first:
the bombs are refused before Pillow reads a byte). Medians of ``--repeats``.

Part 2 (``--victim-seconds``, 0 skips it): one ``MediaLoader``, two tenants. The victim loads a new
64x64 PNG (a data URL) one after another; the attacker keeps ``--attackers`` loads of new
progressive JPEGs of 90 repeated scans running (under the structure check's limit: ~0.5 s of Pillow
each at 2000x2000), either awaiting them (``bombs``) or hanging up 0.3 s into each and sending the
next (``bombs, hang up``). Two arms, interleaved window by window: ``processes`` (the gateway's
decode workers) and ``threads`` (the full decode in the decode threads, as before the workers:
reproduced here by running ``validate_image`` in ``DecodeLanes.run``). The victim's p50/p99 and the
attacker's decodes finished or abandoned.

    .venv/bin/python benchmarks/decode_bombs.py --out results/decode_bombs.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import io
import json
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image

from mmgate.config import CacheSettings, MediaSettings
from mmgate.errors import UnsupportedImageError
from mmgate.media.decode import DecodeLanes
from mmgate.media.loader import MediaLoader
from mmgate.media.validate import ImageInfo, validate_image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _procs import ROOT
from _table import Column, pct, render

sys.path.insert(0, str(ROOT))
from tests.support.bombs import many_scans, png, progressive_jpeg
from tests.support.images import data_url, png_data_url

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


async def _thread_decode(lanes: DecodeLanes, pixels: int, tenant: str | None, data: bytes,
                         allowed_formats: tuple[str, ...], max_pixels: int, *, reserved: bool = False) -> ImageInfo:
    """The full decode as before the decode workers: in the lane's threads (cannot be stopped)."""
    work = functools.partial(validate_image, data, allowed_formats=allowed_formats, max_pixels=max_pixels)
    return await lanes.run(pixels, work, reserved=reserved)


def loader_for(arm: str) -> MediaLoader:
    loader = MediaLoader(MediaSettings(max_image_pixels=10**8), CacheSettings(local_cache_bytes=0))
    if arm == "threads":
        lanes = loader._lanes  # the benchmark swaps in the previous design
        lanes.decode = types.MethodType(_thread_decode, lanes)  # type: ignore[method-assign]
    return loader


class _Seeds:
    """Numbers for new images, and new bombs made cheaply (made on the event loop they would stall
    the victim): one bomb padded to whole base64 groups, then distinct bytes after its end marker
    (which decoders ignore), so each is a new image to the gateway's caches."""

    def __init__(self) -> None:
        self.n = 0
        bomb = many_scans(90, 2000)
        bomb += b"\0" * (-len(bomb) % 3)
        self._bomb_b64 = "data:image/jpeg;base64," + data_url(bomb, "").split(",", 1)[1]

    def next(self) -> int:
        self.n += 1
        return self.n

    def bomb(self) -> str:
        return self._bomb_b64 + data_url(self.next().to_bytes(6, "big"), "").split(",", 1)[1]


async def victim_window(arm: str, attack: str, seconds: float, attackers: int, seeds: _Seeds) -> dict[str, Any]:
    loader = loader_for(arm)
    done = {"finished": 0, "abandoned": 0}
    stop = asyncio.Event()

    async def attacker() -> None:
        while not stop.is_set():
            bomb = seeds.bomb()
            load = asyncio.ensure_future(loader.load(bomb, budget=loader.pixel_budget(1), tenant_tag="attacker"))
            try:
                await asyncio.wait([load], timeout=0.3 if attack == "bombs, hang up" else None)
            finally:
                if not load.done():  # the window ended while it decoded
                    load.cancel()
            if load.done():
                done["finished"] += 1
                with contextlib.suppress(Exception):
                    load.result()
            else:
                load.cancel()
                done["abandoned"] += 1

    await loader.load(png_data_url(seeds.next(), 64), budget=loader.pixel_budget(1), tenant_tag="victim")  # warm
    tasks = [asyncio.create_task(attacker()) for _ in range(attackers if attack != "unloaded" else 0)]
    await asyncio.sleep(0.5 if tasks else 0)
    latencies = []
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        url = png_data_url(seeds.next(), 64)
        t0 = time.perf_counter()
        await loader.load(url, budget=loader.pixel_budget(1), tenant_tag="victim")
        latencies.append(1000 * (time.perf_counter() - t0))
        await asyncio.sleep(0.02)
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await loader.close()
    # Decodes that threads still run (they cannot be stopped) would load the next window: drained.
    lanes = loader._lanes
    await asyncio.to_thread(lanes._normal.shutdown, wait=True)
    await asyncio.to_thread(lanes._large.shutdown, wait=True)
    return {"arm": arm, "attack": attack, "latencies": latencies, **done}


async def victim_part(seconds: float, attackers: int, rounds: int) -> list[dict[str, Any]]:
    seeds = _Seeds()
    windows: list[dict[str, Any]] = []
    for _ in range(rounds):
        for attack in ("unloaded", "bombs", "bombs, hang up"):
            for arm in ("processes", "threads"):
                windows.append(await victim_window(arm, attack, seconds, attackers, seeds))
    rows = []
    for attack in ("unloaded", "bombs", "bombs, hang up"):
        for arm in ("processes", "threads"):
            mine = [w for w in windows if w["arm"] == arm and w["attack"] == attack]
            lat = [x for w in mine for x in w["latencies"]]
            rows.append({"arm": arm, "attack": attack, "n": len(lat), "p50_ms": statistics.median(lat),
                         "p99_ms": pct(lat, 99), "finished": sum(w["finished"] for w in mine),
                         "abandoned": sum(w["abandoned"] for w in mine)})
    base = {r["arm"]: r["p99_ms"] for r in rows if r["attack"] == "unloaded"}
    for r in rows:
        r["p99_vs_unloaded"] = r["p99_ms"] / base[r["arm"]]
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--victim-seconds", type=float, default=4.0, help="length of each victim window (0: skip)")
    p.add_argument("--attackers", type=int, default=2, help="the attacker's loads in flight at once")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the victim windows")
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
    victim: list[dict[str, Any]] = []
    if args.victim_seconds > 0:
        victim = asyncio.run(victim_part(args.victim_seconds, args.attackers, args.rounds))
        print()
        print(render([Column("attack", 16, lambda r: r["attack"], left=True),
                      Column("decodes in", 11, lambda r: r["arm"], left=True),
                      Column("victim n", 9, lambda r: str(r["n"])),
                      Column("p50 ms", 9, lambda r: f"{r['p50_ms']:.1f}"),
                      Column("p99 ms", 9, lambda r: f"{r['p99_ms']:.1f}"),
                      Column("p99/unloaded", 13, lambda r: f"{r['p99_vs_unloaded']:.1f}x"),
                      Column("bombs done", 11, lambda r: str(r["finished"])),
                      Column("hung up", 9, lambda r: str(r["abandoned"]))], victim))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"repeats": args.repeats, "rows": rows, "victim_seconds": args.victim_seconds,
                                    "attackers": args.attackers, "rounds": args.rounds, "victim": victim}, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
