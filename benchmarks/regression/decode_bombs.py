"""What a decode bomb costs with and without the gateway's structure check, what ordinary images
cost per pixel (the CPU budget's base), and what costly decodes that pass it do to another tenant's
images.

Part 0: the CPU time (``time.process_time``, as the decode workers are measured) of the decode
``validate_image`` runs, per pixel, for ordinary images of each format at ``--cost-sizes`` (a photo-like
blend of noise, gradient and fractal, and pure noise: the costliest content for every entropy
coder), then for the costliest bombs the structure check lets through (90 repeated scans: the
gradient scan ``attacks.py`` sends, and a luma refinement scan of noise). Each against the gateway's
budget (``mmgate.media.decode.decode_cpu_budget_s``): ordinary images must stay far under it.

Part 1: for each bomb (a progressive JPEG with repeated scans, a PNG of empty ancillary chunks) and
one ordinary image of the same size: the wall time of Pillow opening and decoding it as validation
does (``draft`` for JPEG), and of ``mmgate.media.validate.validate_image`` (structure check first:
the bombs are refused before Pillow reads a byte). Medians of ``--repeats``.

Part 2 (``--victim-seconds``, 0 skips it): one ``MediaLoader``, two tenants. The victim loads a new
64x64 PNG (a data URL) one after another; the attacker keeps ``--attackers`` loads of new
progressive JPEGs of 90 repeated scans running (under the structure check's limit: ~0.25 s of Pillow
each at 2000x2000), either awaiting them (``bombs``) or hanging up 0.3 s into each and sending the
next (``bombs, hang up``). Two arms, interleaved window by window: ``processes`` (the gateway's
decode workers) and ``threads`` (the full decode in the decode threads, as before the workers:
reproduced here by running ``validate_image`` in ``DecodeLanes.run``). The victim's p50/p99 and the
attacker's decodes finished or abandoned.

    .venv/bin/python benchmarks/regression/decode_bombs.py --out results/decode_bombs.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import io
import statistics
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image
from tests.support.bombs import many_scans, png, progressive_jpeg
from tests.support.images import data_url, png_data_url

from benchmarks._procs import ROOT
from benchmarks._run import parse_args, write_results
from benchmarks._table import Column, pct, render
from mmgate.config import CacheSettings, MediaSettings
from mmgate.errors import UnsupportedImageError
from mmgate.media.decode import DECODE_CPU_PER_PIXEL_S, DecodeLanes, decode_cpu_budget_s
from mmgate.media.loader import MediaLoader
from mmgate.media.validate import ImageInfo, validate_image

FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP")
QUICK = {"repeats": 1, "cost_sizes": [64], "jpeg_scans": 100, "png_chunks": [2000], "victim_seconds": 0.3,
         "attackers": 1, "rounds": 1}


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


def _encoded(img: Image.Image, fmt: str, **options: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **options)
    return buf.getvalue()


def _photo(n: int) -> Image.Image:
    noise = Image.effect_noise((n, n), 64).convert("RGB")
    gradient = Image.radial_gradient("L").resize((n, n)).convert("RGB")
    fractal = Image.effect_mandelbrot((n, n), (-2, -1.5, 1, 1.5), 100).convert("RGB")
    return Image.blend(Image.blend(noise, gradient, 0.5), fractal, 0.3)


def _noise_refinement_bomb(n: int, extra: int = 90) -> bytes:
    """A progressive JPEG of noise whose last scan (luma AC refinement: the costliest) is repeated."""
    data = _encoded(Image.effect_noise((n, n), 128).convert("RGB"), "JPEG", quality=100, progressive=True)
    last = data.rindex(b"\xff\xda")
    return data[:-2] + data[last:-2] * extra + b"\xff\xd9"


def ordinary_images(n: int) -> dict[str, bytes]:
    photo, noise = _photo(n), Image.effect_noise((n, n), 128).convert("RGB")
    cases = {}
    for content, img in (("photo", photo), ("noise", noise)):
        cases[f"baseline JPEG q95, {content}"] = _encoded(img, "JPEG", quality=95)
        cases[f"progressive JPEG q95, {content}"] = _encoded(img, "JPEG", quality=95, progressive=True)
        cases[f"PNG RGB, {content}"] = _encoded(img, "PNG")
        cases[f"PNG RGBA, {content}"] = _encoded(img.convert("RGBA"), "PNG")
        cases[f"WEBP q90, {content}"] = _encoded(img, "WEBP", quality=90, method=2)
        cases[f"WEBP lossless, {content}"] = _encoded(img, "WEBP", lossless=True, method=0)
        cases[f"GIF, {content}"] = _encoded(img.convert("P"), "GIF")
    return cases


def cpu_per_pixel(sizes: list[int], repeats: int) -> list[dict[str, Any]]:
    """Part 0: the CPU per pixel of the decode ``validate_image`` runs (``pillow_decode``: without
    the structure check, so the bombs show what they cost once let through), min of ``repeats``."""
    rows = []
    for n in sizes:
        cases = [(name, "ordinary", data) for name, data in ordinary_images(n).items()]
        cases += [("JPEG +90 gradient scans", "bomb", many_scans(90, n)),
                  ("JPEG +90 noise refinement scans", "bomb", _noise_refinement_bomb(n))]
        for name, kind, data in cases:
            cpu = []
            for _ in range(repeats):
                started = time.process_time()
                pillow_decode(data)
                cpu.append(time.process_time() - started)
            pixels = n * n
            rows.append({"size": n, "image": name, "kind": kind, "cpu_ms": 1000 * min(cpu),
                         "ns_per_pixel": 1e9 * min(cpu) / pixels, "budget_ms": 1000 * decode_cpu_budget_s(pixels)})
    return rows


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
    p.add_argument("--cost-sizes", type=int, nargs="*", default=[1000, 2000],
                   help="square sizes of the per-pixel cost images (none: skip part 0)")
    p.add_argument("--jpeg-scans", type=int, default=2000, help="repeated scans of part 1's JPEG bomb")
    p.add_argument("--png-chunks", type=int, nargs="*", default=[200_000, 800_000],
                   help="empty ancillary chunks of part 1's PNG bombs")
    p.add_argument("--victim-seconds", type=float, default=4.0, help="length of each victim window (0: skip)")
    p.add_argument("--attackers", type=int, default=2, help="the attacker's loads in flight at once")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the victim windows")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "decode_bombs.json")
    args = parse_args(p, QUICK)
    costs = cpu_per_pixel(args.cost_sizes, args.repeats)
    if costs:
        print(render([Column("size", 6, lambda r: str(r["size"])),
                      Column("  image", 36, lambda r: "  " + r["image"], left=True),
                      Column("CPU ms", 9, lambda r: f"{r['cpu_ms']:.1f}"),
                      Column("ns/pixel", 9, lambda r: f"{r['ns_per_pixel']:.1f}"),
                      Column("budget ms", 10, lambda r: f"{r['budget_ms']:.0f}"),
                      Column("of budget", 10, lambda r: f"{r['cpu_ms'] / r['budget_ms']:.0%}")], costs))
        worst = max(r["ns_per_pixel"] for r in costs if r["kind"] == "ordinary")
        print(f"costliest ordinary image: {worst:.1f} ns/pixel; budget {1e9 * DECODE_CPU_PER_PIXEL_S:.0f} ns/pixel "
              f"+ floor: {1e9 * DECODE_CPU_PER_PIXEL_S / worst:.1f}x it\n")
    cases = {
        "jpeg 1000x1000, 11 scans": progressive_jpeg(1000),
        f"jpeg 1000x1000, +{args.jpeg_scans} scans": many_scans(args.jpeg_scans, 1000),
        "png 32x32, 10 tEXt chunks": png(ancillary=10),
        **{f"png 32x32, +{n // 1000}k tEXt chunks": png(ancillary=n) for n in args.png_chunks},
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
    write_results(args.out, {"repeats": args.repeats, "cpu_per_pixel": costs, "rows": rows,
                             "victim_seconds": args.victim_seconds, "attackers": args.attackers, "rounds": args.rounds,
                             "victim": victim})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
