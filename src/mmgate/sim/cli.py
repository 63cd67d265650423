"""``mmgate sim``: run one embedded vLLM-like engine (a stand-in for vLLM, not a model)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable

from pydantic import ValidationError

from mmgate.aio import install_uvloop, serve_forever
from mmgate.cli import env_bool, env_default
from mmgate.errors import ConfigError
from mmgate.sim.config import SimSettings
from mmgate.sim.server import start_sim

DESCRIPTION = """\
Run the embedded vLLM-like engine alone. It is a stand-in for vLLM, not a model: it speaks
vLLM's OpenAI-compatible API (/v1/chat/completions with SSE streaming, /v1/models, /health,
/metrics), keeps vLLM's multimodal processor cache (LRU by bytes, keyed by the image part's uuid or
a content hash; UUID-only references hit it or fail with vLLM's 400 "Cache miss ..."), does real
per-image work on a miss (decode, resize to the Qwen2-VL patch grid, normalise to float32), and
answers with deterministic text after modelled prefill and decode delays. Every flag also reads
MMGATE_<FLAG> from the environment.
"""

# (flag, field, type, help)
_FLAGS: tuple[tuple[str, str, type, str], ...] = (
    ("--host", "host", str, "address to bind (default 127.0.0.1)"),
    ("--port", "port", int, "port to bind; 0 picks a free port (default 8001)"),
    ("--model", "model", str, "served model name, like vLLM's --served-model-name (default mmgate-sim-vl)"),
    ("--mm-processor-cache-gb", "mm_processor_cache_gb", float,
     "processor cache size in GiB, like vLLM's flag; 0 disables it (default 4)"),
    ("--speedup", "speedup", float, "divide every modelled time by this; large values ≈ no latency (default 1)"),
    ("--prefill-us-per-text-token", "prefill_us_per_text_token", float,
     "modelled prefill time per text token, microseconds (default 40)"),
    ("--prefill-us-per-image-token", "prefill_us_per_image_token", float,
     "modelled prefill time per image token, microseconds (default 120)"),
    ("--decode-ms-per-token", "decode_ms_per_token", float,
     "modelled time between generated tokens, milliseconds (default 10)"),
    ("--default-max-tokens", "default_max_tokens", int, "max_tokens when a request gives none (default 16)"),
    ("--max-model-len", "max_model_len", int, "context length: prompt + completion tokens (default 131072)"),
    ("--min-pixels", "min_pixels", int, "smallest resized image area in pixels (default 3136)"),
    ("--max-pixels", "max_pixels", int, "largest resized image area in pixels (default 1003520 = 1280*28*28)"),
    ("--max-image-bytes", "max_image_bytes", int, "largest encoded image accepted, bytes (default 20 MiB)"),
    ("--max-images-per-request", "max_images_per_request", int,
     "most images in one request, like vLLM's --limit-mm-per-prompt (default 64)"),
    ("--fetch-timeout-s", "fetch_timeout_s", float, "timeout for http(s) image URLs, seconds (default 10)"),
    ("--processor-workers", "processor_workers", int, "threads for image decode and processing (default 2)"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``mmgate sim``'s flags."""
    parser.description = DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    for flag, field, kind, help_text in _FLAGS:
        parser.add_argument(flag, dest=field, type=kind, default=env_default(flag, None), help=help_text)
    parser.add_argument(
        "--no-decode-on-hit", dest="decode_on_hit", action="store_false",
        default=not env_bool("--no-decode-on-hit"),
        help="skip decoding images that carry data but hit the cache (vLLM decodes them)",
    )


def settings_from_args(args: argparse.Namespace) -> SimSettings:
    """Build validated settings; a bad value raises ConfigError naming the flag."""
    values: dict[str, object] = {}
    names: dict[str, str] = {"decode_on_hit": "--no-decode-on-hit"}
    for flag, field, _, _ in _FLAGS:
        names[field] = flag
        value = getattr(args, field, None)
        if value is not None:
            values[field] = value
    values["decode_on_hit"] = args.decode_on_hit
    # Not mmgate.config.build: its first parameter is called `model`, like our served-model field.
    try:
        return SimSettings.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = err.get("loc", ())
        field = str(loc[0]) if loc else ""
        raise ConfigError(names.get(field, "mmgate sim"), str(err.get("msg", exc))) from exc


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

    asyncio.run(serve_forever(start))
    return 0
