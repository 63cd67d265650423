"""One benchmark run end to end: origin, image preparation, warm-up, measured phase, results.

``run_benchmark`` is what ``mmgate bench run`` calls inside ``asyncio.run``; tests and
``benchmarks/regression/bench_fidelity.py`` call it directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from mmgate.bench.client import ChatClient
from mmgate.bench.dataset import Session
from mmgate.bench.engine_metrics import EngineMetrics
from mmgate.bench.errors import BenchError
from mmgate.bench.html import run_report
from mmgate.bench.image_server import ImageOrigin
from mmgate.bench.images import DatasetImages
from mmgate.bench.load import LoadEngine
from mmgate.bench.overhead import ClientOverhead, LoopLagMonitor, client_warnings
from mmgate.bench.payload import BodyOptions
from mmgate.bench.progress import LiveProgress
from mmgate.bench.records import RecordStore, RequestLog, RequestRecord
from mmgate.bench.report import build_summary, engine_summary, print_summary, write_summary
from mmgate.bench.settings import BenchSettings
from mmgate.bench.stats import distribution


@dataclass
class RunOutput:
    """A finished run: its summary, the files written, and the store (for callers that plot)."""

    summary: dict[str, Any]
    files: list[Path] = field(default_factory=list)
    store: RecordStore | None = None


async def _pick_model(client: ChatClient, settings: BenchSettings) -> str:
    if settings.model:
        return settings.model
    models = await client.list_models()
    if not models:
        raise BenchError(f"{client.models_url} lists no model; give --model")
    return models[0]


# The sim's model card (``mmgate sim``), relayed by a gateway in front of it.
SIM_OWNER = "mmgate-sim"


def refuse_unsupported_videos(settings: BenchSettings, sessions: list[Session]) -> bool:
    """Whether the dataset has videos; ``BenchError`` when ``--api`` cannot carry them."""
    if not any(s.has_videos for s in sessions):
        return False
    if settings.api != "chat":
        raise BenchError(f"--api {settings.api} cannot carry the dataset's videos: vLLM's Responses and "
                         "Anthropic Messages endpoints take no video parts; use --api chat", param="--api")
    return True


async def _refuse_sim(client: ChatClient, model: str) -> None:
    """The sim takes no video parts: refuse before the run rather than count a 400 per request."""
    if not client.model_owners:
        with contextlib.suppress(BenchError):  # an endpoint that lists no models: let the run say
            await client.list_models()
    if client.model_owners.get(model) == SIM_OWNER:
        raise BenchError(f"{client.models_url} serves {model!r} from mmgate's sim engine, which takes no video "
                         "parts (it models image processing only): point --url at vLLM, or at a gateway in "
                         "front of vLLM, started with video allowed (--limit-mm-per-prompt)", param="--url")


async def run_benchmark(
    settings: BenchSettings,
    sessions: list[Session],
    output_dir: Path | None,
    *,
    console: Console | None = None,
    progress: bool = False,
    plots: bool = True,
    name: str | None = None,
) -> RunOutput:
    """Run the warm-up then the measured phase; write results when ``output_dir`` is given.
    ``name`` names the run in its summary, plots and report (default: the output folder's name)."""
    console = console or Console()
    has_videos = refuse_unsupported_videos(settings, sessions)
    uses_files = any(e.is_local_file for s in sessions for t in s.turns for e in t.images)
    origin: ImageOrigin | None = None
    resolver: DatasetImages
    if settings.image_mode == "origin" and uses_files:
        holder: list[DatasetImages] = []
        origin = ImageOrigin(lambda name: holder[0].origin_path(name), settings.origin_host,
                             settings.origin_port)
        base = await origin.start()
        resolver = DatasetImages("origin", settings.image_cache_bytes, base)
        holder.append(resolver)
    else:
        resolver = DatasetImages("data", settings.image_cache_bytes)
    try:
        prepared = await resolver.prepare_all(e for s in sessions for t in s.turns for e in t.images)
        async with ChatClient(
            settings.url, api_key=settings.api_key, headers=dict(settings.headers),
            session_header=settings.session_header or None, request_timeout_s=settings.request_timeout_s,
            connect_timeout_s=settings.connect_timeout_s, max_connections=settings.max_connections,
            chat_path=settings.chat_path, api=settings.api,
        ) as client:
            model = await _pick_model(client, settings)
            if has_videos:
                await _refuse_sim(client, model)
            options = BodyOptions(model, settings.stream, settings.output_length, settings.extra_body,
                                  settings.api)
            if settings.warmup_requests:
                warm = LoadEngine(settings, sessions, client, resolver, options)
                await warm.run(request_count=settings.warmup_requests, duration_s=None, cycle=True,
                               prefix=settings.session_prefix + "warmup-")
            run_name = name or (output_dir.name if output_dir is not None else model)
            return await _measure(settings, sessions, client, resolver, options, model, run_name, output_dir,
                                  console, progress, plots, origin, prepared)
    finally:
        if origin is not None:
            await origin.stop()


async def _measure(
    settings: BenchSettings,
    sessions: list[Session],
    client: ChatClient,
    resolver: DatasetImages,
    options: BodyOptions,
    model: str,
    name: str,
    output_dir: Path | None,
    console: Console,
    show_progress: bool,
    plots: bool,
    origin: ImageOrigin | None,
    prepared: tuple[int, int],
) -> RunOutput:
    loop_monitor = LoopLagMonitor()
    base_ns = time.perf_counter_ns()
    store = RecordStore(base_ns, settings.max_records, settings.seed)
    log = RequestLog(output_dir, base_ns) if output_dir is not None else None

    def on_record(record: RequestRecord) -> None:
        store.add(record)
        if log is not None:
            log.add(record)

    origin_before = (origin.stats.requests, origin.stats.bytes_served) if origin else (0, 0)
    async with contextlib.AsyncExitStack() as stack:
        probe = None
        if settings.engine_metrics:
            probe = await stack.enter_async_context(EngineMetrics(settings.engine_metrics))
        sequential = settings.concurrency == 1 and settings.request_rate is None
        engine = LoadEngine(settings, sessions, client, resolver, options, on_record, probe if sequential else None)
        before = await probe.read() if probe is not None else None
        await _play(settings, sessions, engine, store, log, loop_monitor, show_progress)
        engine_totals = await probe.read() - before if probe is not None and before is not None else None
    send = distribution(store.ms("send_lag_ns", ok_only=False))
    overhead = ClientOverhead(loop_monitor.cpu_percent, loop_monitor.cpu_s, loop_monitor.wall_s,
                              loop_monitor.lag_ms(), send)
    summary = build_summary(
        config=settings.public_config(), model=model, store=store, overhead=overhead, warnings=[],
        origin=None if origin is None else {
            "requests": origin.stats.requests - origin_before[0],
            "bytes_served": origin.stats.bytes_served - origin_before[1],
        },
        prepared_images=prepared,
    )
    summary["name"] = name
    if engine_totals is not None:
        summary["engine"] = engine_summary(engine_totals, store)
    summary["client"]["warnings"] = client_warnings(
        overhead, settings.request_rate, summary["totals"]["request_throughput"]
    )
    files: list[Path] = []
    if output_dir is not None:
        files += write_summary(summary, output_dir)
        if log is not None:
            files += [log.csv_path, log.jsonl_path]
        pngs: list[Path] = []
        if plots:
            try:
                from mmgate.bench.plots import write_plots
            except ImportError:  # matplotlib comes with the plots (or bench) extra
                console.print("plots skipped: matplotlib is missing (pip install 'mmgate[plots]')", markup=False)
            else:
                title = f"{name}: {model} — {settings.url}"
                pngs = await asyncio.to_thread(write_plots, store, output_dir, title)
        files += pngs
        report = output_dir / "report.html"
        report.write_text(run_report(summary, name, pngs))
        files.append(report)
    print_summary(summary, console)
    return RunOutput(summary, files, store)


async def _play(settings: BenchSettings, sessions: list[Session], engine: LoadEngine, store: RecordStore,
                log: RequestLog | None, loop_monitor: LoopLagMonitor, show_progress: bool) -> None:
    """The measured phase itself, with its progress bar and loop-lag monitor."""
    live = LiveProgress(show_progress)
    loop_monitor.start()
    total = settings.request_count
    if total is None and settings.duration_s is None:
        total = sum(len(s.turns) for s in sessions)  # one pass over the dataset
    await live.run(lambda: (store.totals.requests, store.totals.errors, engine.in_flight),
                   total, settings.duration_s)
    try:
        await engine.run(request_count=settings.request_count, duration_s=settings.duration_s,
                         cycle=settings.cycles_dataset, prefix=settings.session_prefix)
    finally:
        await live.stop()
        await loop_monitor.stop()
        if log is not None:
            await log.close()
