"""``mmgate bench``: ``run`` a benchmark, generate a ``dataset``, ``compare`` two runs.

    mmgate bench run --url http://127.0.0.1:8000 --dataset FILE --dataset-type single_turn \\
        --concurrency 8 --uuid-and-strip --output-dir bench-out/strip
    mmgate bench dataset sliding-window --sessions 16 --turns 10 --window 4 --out data/sw
    mmgate bench compare bench-out/plain/summary.json bench-out/strip/summary.json

Every flag reads its default from ``MMGATE_<FLAG>``; ``run``'s flags are generated from
``BenchSettings`` (``mmgate._settings``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from mmgate._env import env_bool, env_list, env_value
from mmgate._settings import ConfigError, Flag, MiB, add_flags, from_args
from mmgate.bench.dataset import DATASET_TYPES, load_dataset
from mmgate.bench.errors import BenchError
from mmgate.bench.settings import BenchSettings

if TYPE_CHECKING:
    from rich.console import Console


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``run``, ``dataset`` and ``compare`` subcommands."""
    sub = parser.add_subparsers(dest="bench_command", metavar="SUBCOMMAND", required=True)
    _add_run(sub.add_parser("run", help="drive an OpenAI-compatible endpoint with a dataset",
                            description="drive an OpenAI-compatible endpoint with a dataset"))
    ds = sub.add_parser("dataset", help="generate a synthetic dataset")
    ds_sub = ds.add_subparsers(dest="dataset_kind", metavar="KIND", required=True)
    _add_sliding_window(ds_sub.add_parser(
        "sliding-window", help="N sessions x T turns, each showing the last W images",
        description="N sessions x T turns, each showing the last W images (JSONL + image files)"))
    cmp = sub.add_parser("compare", help="two runs side by side, with the ratio B/A")
    cmp.add_argument("a", metavar="A.json", help="summary.json of run A (or its directory)")
    cmp.add_argument("b", metavar="B.json", help="summary.json of run B (or its directory)")
    cmp.add_argument("--all-stats", action="store_true", help="also min, max and std of distributions")
    cmp.add_argument("--output-dir", default=None,
                     help="also write compare.json, compare.png (B/A of the key metrics) and compare.html here")


def _add_run(p: argparse.ArgumentParser) -> None:
    flags = add_flags(p, BenchSettings)
    g = p.add_argument_group("load")
    g.add_argument("--extra-inputs", action="append", default=env_list("--extra-inputs"), metavar="KEY:VALUE",
                   help="extra body field, VALUE parsed as JSON when it can be (repeatable)")
    g.add_argument("--extra-body", default=env_value("--extra-body"), metavar="JSON",
                   help="extra body fields as one JSON object")
    g = p.add_argument_group("output")
    g.add_argument("--output-dir", default=env_value("--output-dir"),
                   help="results folder (default bench-out/run-<time>)")
    g.add_argument("--name", default=env_value("--name"),
                   help="the run's name in its summary, plots and report.html (default: the results folder's name)")
    # default None: MMGATE_NO_PLOTS / MMGATE_QUIET are read (and a bad word refused) when the run
    # starts, not while every subcommand's parser is built.
    g.add_argument("--no-plots", action="store_true", default=None,
                   help="write no PNG plots (env MMGATE_NO_PLOTS)")
    g.add_argument("--quiet", action="store_true", default=None, help="no progress bar (env MMGATE_QUIET)")
    p.set_defaults(_bench_flags=flags)


def _switch(given: bool | None, flag: str) -> bool:
    """A hand-made switch: the flag when given, else ``MMGATE_<FLAG>``; a bad word raises ConfigError."""
    if given:
        return True
    try:
        return bool(env_bool(flag))
    except ValueError as exc:
        raise ConfigError(flag, str(exc)) from exc


def _opt_int(value: str) -> int | None:
    return None if value in ("", None) else int(value)


def _opt_float(value: str) -> float | None:
    return None if value in ("", None) else float(value)


def _add_sliding_window(p: argparse.ArgumentParser) -> None:
    from mmgate.bench.synth import SlidingWindowSpec

    spec = {f.name: f.default for f in dataclasses.fields(SlidingWindowSpec)}

    def e(flag: str, field: str) -> Any:
        """The default: MMGATE_<FLAG>, else the spec's (spelled once, in SlidingWindowSpec)."""
        return env_value(flag) or spec[field]

    p.add_argument("--sessions", type=int, default=e("--sessions", "sessions"), help="(default %(default)s)")
    p.add_argument("--turns", type=int, default=e("--turns", "turns"), help="(default %(default)s)")
    p.add_argument("--window", type=int, default=e("--window", "window"),
                   help="images shown per turn (default %(default)s)")
    p.add_argument("--new-per-turn", type=int, default=e("--new-per-turn", "new_per_turn"),
                   help="(default %(default)s)")
    p.add_argument("--image-size", type=int, default=e("--image-size", "image_size"),
                   help="side in pixels (default %(default)s)")
    p.add_argument("--image-format", choices=("jpeg", "png"), default=e("--image-format", "image_format"))
    p.add_argument("--media", choices=("image", "video"), default=e("--media", "media"),
                   help="what each turn shows: screenshots, or short MP4 clips (video_url parts; --image-size "
                        "is then the clips' side)")
    p.add_argument("--clip-frames", type=int, default=e("--clip-frames", "clip_frames"),
                   help="frames per clip (default %(default)s)")
    p.add_argument("--clip-fps", type=int, default=e("--clip-fps", "clip_fps"), help="(default %(default)s)")
    p.add_argument("--dataset-type", choices=DATASET_TYPES, default=e("--dataset-type", "dataset_type"))
    p.add_argument("--output-length", type=_opt_int, default=e("--output-length", "output_length"))
    p.add_argument("--delay", type=_opt_float, default=e("--delay", "delay_ms"), help="ms between turns")
    p.add_argument("--image-uuids", action="store_true", help="author image_uuids (video_uuids) in the dataset")
    p.add_argument("--seed", type=int, default=e("--seed", "seed"), help="(default %(default)s)")
    p.add_argument("--out", required=True, help="output folder")


def parse_extra(items: list[str], body_json: str | None) -> dict[str, Any]:
    """``--extra-body`` then ``--extra-inputs KEY:VALUE`` (VALUE as JSON when it parses)."""
    out: dict[str, Any] = {}
    if body_json:
        try:
            parsed = orjson.loads(body_json)
        except orjson.JSONDecodeError as exc:
            raise ConfigError("--extra-body", f"not valid JSON: {exc}") from exc
        if not isinstance(parsed, dict):
            raise ConfigError("--extra-body", "expected a JSON object")
        out.update(parsed)
    for item in items:
        key, sep, raw = item.partition(":")
        if not sep or not key.strip():
            raise ConfigError("--extra-inputs", f"expected KEY:VALUE, got {item!r}")
        try:
            out[key.strip()] = orjson.loads(raw)
        except orjson.JSONDecodeError:
            out[key.strip()] = raw
    return out


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    """Validated settings; a bad value raises ConfigError naming the flag."""
    flags: list[Flag] = args._bench_flags
    return from_args(args, BenchSettings, flags, extra_body=parse_extra(args.extra_inputs, args.extra_body))


def _require_bench_extra() -> None:
    """``run`` and ``compare`` print with rich, which comes with the ``bench`` extra."""
    if importlib.util.find_spec("rich") is None:
        raise BenchError("mmgate bench run/compare need the bench extra: pip install 'mmgate[bench]'")


def _console() -> Console:
    """Rich console; 120 columns when not a terminal (rich would assume 80 and cut numbers)."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=120)


def _run(args: argparse.Namespace) -> int:
    from mmgate.app_runtime import install_uvloop
    from mmgate.bench.runner import run_benchmark

    settings = settings_from_args(args)
    quiet = _switch(args.quiet, "--quiet")
    no_plots = _switch(args.no_plots, "--no-plots")
    sessions = load_dataset(settings.dataset, settings.dataset_type)
    out = Path(args.output_dir) if args.output_dir else Path("bench-out") / time.strftime("run-%Y%m%d-%H%M%S")
    install_uvloop()
    output = asyncio.run(run_benchmark(settings, sessions, out, console=_console(), progress=not quiet,
                                       plots=not no_plots, name=args.name or None))
    print(f"results: {out}/ ({', '.join(p.name for p in output.files)})", file=sys.stderr)
    return 0


def _dataset(args: argparse.Namespace) -> int:
    from mmgate.bench.synth import SlidingWindowSpec, generate_sliding_window

    spec = SlidingWindowSpec(
        sessions=args.sessions, turns=args.turns, window=args.window, image_size=args.image_size,
        image_format=args.image_format, new_per_turn=args.new_per_turn, dataset_type=args.dataset_type,
        output_length=args.output_length, delay_ms=args.delay, author_uuids=args.image_uuids, seed=args.seed,
        media=args.media, clip_frames=args.clip_frames, clip_fps=args.clip_fps,
    )
    try:
        made = generate_sliding_window(spec, args.out)
    except ValueError as exc:
        raise BenchError(str(exc)) from exc
    noun = "clips" if made.media == "video" else "images"
    each = made.make_seconds / made.images * 1e3 if made.images else 0.0
    print(f"wrote {made.path} ({made.dataset_type}): {made.sessions} sessions, {made.requests} requests, "
          f"{made.images} {noun} ({made.image_bytes / MiB:.1f} MiB, made in {made.make_seconds:.2f} s, "
          f"{each:.1f} ms each)")
    return 0


def run(args: argparse.Namespace) -> int:
    """Dispatch; a ``BenchError`` (bad dataset line, unreachable server) prints one line, exit 2."""
    try:
        if args.bench_command != "dataset":
            _require_bench_extra()
        if args.bench_command == "run":
            return _run(args)
        if args.bench_command == "dataset":
            return _dataset(args)
        from mmgate.bench.compare import print_comparison

        out = Path(args.output_dir) if args.output_dir else None
        return print_comparison(args.a, args.b, _console(), all_stats=args.all_stats, output_dir=out)
    except BenchError as exc:
        print(f"mmgate bench: {exc.message}", file=sys.stderr)
        return 2
