"""``mmgate sim``: run one embedded vLLM-like engine (a stand-in for vLLM, not a model)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable

from mmgate._settings import Flag, add_flags, from_args
from mmgate.app_runtime import install_uvloop, serve_forever
from mmgate.sim.config import SimSettings
from mmgate.sim.server import start_sim

DESCRIPTION = """\
Run the embedded vLLM-like engine alone. It is a stand-in for vLLM, not a model: it speaks
vLLM's OpenAI-compatible API (/v1/chat/completions with SSE streaming, /v1/responses with vLLM's
response store under --responses-store-mb, /v1/models, /health, /metrics), keeps vLLM's multimodal processor cache (LRU by bytes, keyed by the image part's uuid or
a content hash; UUID-only references hit it or fail with vLLM's 400 "Cache miss ..."), does real
per-image work on a miss (decode, resize to the Qwen2-VL patch grid, normalise to float32), and
answers with deterministic text after modelled prefill and decode delays (it calls no tool; tools
are checked as vLLM checks them, --enable-auto-tool-choice and --tool-call-parser included). Every
flag also reads MMGATE_<FLAG> from the environment.
"""

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``mmgate sim``'s flags (generated from ``SimSettings``)."""
    parser.description = DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.set_defaults(_sim_flags=add_flags(parser, SimSettings))


def settings_from_args(args: argparse.Namespace) -> SimSettings:
    """Build validated settings; a bad value raises ConfigError naming the flag."""
    flags: list[Flag] = args._sim_flags
    return from_args(args, SimSettings, flags, fallback="mmgate sim")


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    install_uvloop()

    async def start() -> Callable[[], Awaitable[None]]:
        server = await start_sim(settings)
        print(
            f"mmgate sim (vLLM stand-in) serving model {settings.model!r} on {server.url}/v1 "
            f"(processor cache {settings.mm_processor_cache_gb:g} GiB, speedup {settings.speedup:g})",
            file=sys.stderr, flush=True,
        )
        return server.stop

    try:
        asyncio.run(serve_forever(start))
    except OSError as exc:  # the port is taken, the address is not ours: say so, no traceback
        print(f"mmgate sim: cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    return 0
