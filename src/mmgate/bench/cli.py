"""``mmgate bench``: ``run`` a benchmark, generate a ``dataset``, ``compare`` two runs.

    mmgate bench run --url http://127.0.0.1:8000 --dataset FILE --dataset-type single_turn \\
        --concurrency 8 --uuid-and-strip --output-dir bench-out/strip
    mmgate bench dataset sliding-window --sessions 16 --turns 10 --window 4 --out data/sw
    mmgate bench compare bench-out/plain/summary.json bench-out/strip/summary.json

Every flag reads its default from ``MMGATE_<FLAG>`` (``mmgate.cli.env_default``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any, cast

import orjson
from rich.console import Console

from mmgate.bench.dataset import DATASET_TYPES, load_dataset
from mmgate.bench.errors import BenchError
from mmgate.bench.images import IMAGE_MODES
from mmgate.bench.settings import FLAG_NAMES, BenchSettings
from mmgate.cli import env_bool, env_default, env_list
from mmgate.config import MiB, build
from mmgate.errors import ConfigError


def _opt_int(value: str) -> int | None:
    return None if value in ("", None) else int(value)


def _opt_float(value: str) -> float | None:
    return None if value in ("", None) else float(value)


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


def _add_run(p: argparse.ArgumentParser) -> None:
    e = env_default
    g = p.add_argument_group("endpoint")
    g.add_argument("--url", default=e("--url", "http://127.0.0.1:8000"),
                   help="base URL of the OpenAI-compatible server, with or without /v1")
    g.add_argument("--endpoint", default=e("--endpoint", "/v1/chat/completions"), help="chat path")
    g.add_argument("--model", default=e("--model", None), help="model name (default: first of /v1/models)")
    g.add_argument("--api-key", default=e("--api-key", None), help="sent as Authorization: Bearer KEY")
    g.add_argument("--header", action="append", default=env_list("--header"), metavar="NAME:VALUE",
                   help="extra request header (repeatable)")
    g.add_argument("--session-header", default=e("--session-header", "x-session-id"), metavar="NAME",
                   help="header carrying each session's id ('' to send none)")
    g = p.add_argument_group("dataset")
    g.add_argument("--dataset", default=e("--dataset", None), required=env_default("--dataset", None) is None,
                   help="JSONL file (AIPerf custom dataset format)")
    g.add_argument("--dataset-type", choices=DATASET_TYPES, default=e("--dataset-type", "single_turn"))
    g.add_argument("--image-mode", choices=IMAGE_MODES, default=e("--image-mode", "data"),
                   help="local image files as data: URLs, or served by a loopback image origin")
    g.add_argument("--origin-host", default=e("--origin-host", "127.0.0.1"))
    g.add_argument("--origin-port", type=int, default=e("--origin-port", 0))
    g.add_argument("--image-cache-mb", type=float, default=e("--image-cache-mb", 512),
                   help="memory for prepared images (data: URLs)")
    g = p.add_argument_group("load")
    g.add_argument("--concurrency", type=_opt_int, default=e("--concurrency", None),
                   help="sessions in flight at once (default 1 unless --request-rate)")
    g.add_argument("--request-rate", type=_opt_float, default=e("--request-rate", None),
                   help="requests per second (open-loop arrival schedule)")
    g.add_argument("--arrival", choices=("poisson", "constant"), default=e("--arrival", "poisson"))
    g.add_argument("--max-active-sessions", type=int, default=e("--max-active-sessions", 1024))
    g.add_argument("--request-count", type=_opt_int, default=e("--request-count", None))
    g.add_argument("--duration", type=_opt_float, default=e("--duration", None), help="seconds")
    g.add_argument("--warmup-requests", type=int, default=e("--warmup-requests", 0))
    g.add_argument("--grace-period", type=float, default=e("--grace-period", 30.0),
                   help="seconds requests in flight may finish after --duration")
    g.add_argument("--streaming", dest="stream", action="store_true", default=not env_bool("--no-streaming"))
    g.add_argument("--no-streaming", dest="stream", action="store_false")
    g.add_argument("--uuid-and-strip", action="store_true", default=env_bool("--uuid-and-strip"),
                   help="give every image a uuid and send repeats within a session as cache-only references")
    g.add_argument("--output-length", type=_opt_int, default=e("--output-length", None),
                   help="max_tokens of every request (a line's output_length wins)")
    g.add_argument("--extra-inputs", action="append", default=env_list("--extra-inputs"), metavar="KEY:VALUE",
                   help="extra body field, VALUE parsed as JSON when it can be (repeatable)")
    g.add_argument("--extra-body", default=e("--extra-body", None), metavar="JSON",
                   help="extra body fields as one JSON object")
    g.add_argument("--request-timeout", type=float, default=e("--request-timeout", 600.0))
    g.add_argument("--connect-timeout", type=float, default=e("--connect-timeout", 10.0))
    g.add_argument("--session-prefix", default=e("--session-prefix", ""))
    g.add_argument("--seed", type=int, default=e("--seed", 0))
    g.add_argument("--max-records", type=int, default=e("--max-records", 5_000_000),
                   help="per-request rows kept in memory (beyond: a uniform sample)")
    g = p.add_argument_group("output")
    g.add_argument("--output-dir", default=e("--output-dir", None),
                   help="results folder (default bench-out/run-<time>)")
    g.add_argument("--no-plots", action="store_true", default=env_bool("--no-plots"))
    g.add_argument("--quiet", action="store_true", default=env_bool("--quiet"),
                   help="no progress bar")


def _add_sliding_window(p: argparse.ArgumentParser) -> None:
    e = env_default
    p.add_argument("--sessions", type=int, default=e("--sessions", 8))
    p.add_argument("--turns", type=int, default=e("--turns", 10))
    p.add_argument("--window", type=int, default=e("--window", 4), help="images shown per turn")
    p.add_argument("--new-per-turn", type=int, default=e("--new-per-turn", 1))
    p.add_argument("--image-size", type=int, default=e("--image-size", 512), help="side in pixels")
    p.add_argument("--image-format", choices=("jpeg", "png"), default=e("--image-format", "jpeg"))
    p.add_argument("--dataset-type", choices=DATASET_TYPES, default=e("--dataset-type", "single_turn"))
    p.add_argument("--output-length", type=_opt_int, default=e("--output-length", None))
    p.add_argument("--delay", type=_opt_float, default=e("--delay", None), help="ms between turns")
    p.add_argument("--image-uuids", action="store_true", help="author image_uuids in the dataset")
    p.add_argument("--seed", type=int, default=e("--seed", 0))
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


def _headers(items: list[str]) -> tuple[tuple[str, str], ...]:
    out = []
    for item in items:
        name, sep, value = item.partition(":")
        if not sep or not name.strip():
            raise ConfigError("--header", f"expected NAME:VALUE, got {item!r}")
        out.append((name.strip(), value.strip()))
    return tuple(out)


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    values = dict(
        url=args.url, dataset=args.dataset, dataset_type=args.dataset_type, model=args.model or None,
        api_key=args.api_key or None, headers=_headers(args.header),
        session_header=args.session_header or None, chat_path=args.endpoint, stream=args.stream,
        concurrency=args.concurrency, request_rate=args.request_rate, arrival=args.arrival,
        max_active_sessions=args.max_active_sessions, request_count=args.request_count,
        duration_s=args.duration, warmup_requests=args.warmup_requests, grace_period_s=args.grace_period,
        uuid_and_strip=args.uuid_and_strip, output_length=args.output_length,
        extra_body=parse_extra(args.extra_inputs, args.extra_body), session_prefix=args.session_prefix,
        image_mode=args.image_mode, image_cache_bytes=int(args.image_cache_mb * MiB),
        origin_host=args.origin_host, origin_port=args.origin_port,
        request_timeout_s=args.request_timeout, connect_timeout_s=args.connect_timeout,
        max_records=args.max_records, seed=args.seed,
    )
    return cast(BenchSettings, build(BenchSettings, dict(FLAG_NAMES), **values))


def _console() -> Console:
    """Rich console; 120 columns when not a terminal (rich would assume 80 and cut numbers)."""
    return Console() if sys.stdout.isatty() else Console(width=120)


def _run(args: argparse.Namespace) -> int:
    from mmgate.aio import install_uvloop
    from mmgate.bench.runner import run_benchmark

    settings = settings_from_args(args)
    sessions = load_dataset(settings.dataset, settings.dataset_type)
    out = Path(args.output_dir) if args.output_dir else Path("bench-out") / time.strftime("run-%Y%m%d-%H%M%S")
    install_uvloop()
    output = asyncio.run(run_benchmark(settings, sessions, out, console=_console(), progress=not args.quiet,
                                       plots=not args.no_plots))
    print(f"results: {out}/ ({', '.join(p.name for p in output.files)})", file=sys.stderr)
    return 0


def _dataset(args: argparse.Namespace) -> int:
    from mmgate.bench.synth import SlidingWindowSpec, generate_sliding_window

    spec = SlidingWindowSpec(
        sessions=args.sessions, turns=args.turns, window=args.window, image_size=args.image_size,
        image_format=args.image_format, new_per_turn=args.new_per_turn, dataset_type=args.dataset_type,
        output_length=args.output_length, delay_ms=args.delay, author_uuids=args.image_uuids, seed=args.seed,
    )
    try:
        made = generate_sliding_window(spec, args.out)
    except ValueError as exc:
        raise BenchError(str(exc)) from exc
    print(f"wrote {made.path} ({made.dataset_type}): {made.sessions} sessions, {made.requests} requests, "
          f"{made.images} images ({made.image_bytes / MiB:.1f} MiB)")
    return 0


def run(args: argparse.Namespace) -> int:
    """Dispatch; a ``BenchError`` (bad dataset line, unreachable server) prints one line, exit 2."""
    try:
        if args.bench_command == "run":
            return _run(args)
        if args.bench_command == "dataset":
            return _dataset(args)
        from mmgate.bench.compare import print_comparison

        return print_comparison(args.a, args.b, _console(), all_stats=args.all_stats)
    except BenchError as exc:
        print(f"mmgate bench: {exc.message}", file=sys.stderr)
        return 2
