"""Settings of the embedded vLLM-like engine (``mmgate sim``), a stand-in for vLLM, not a model.

Names follow vLLM's flags where one exists (``--served-model-name`` → ``model``,
``--mm-processor-cache-gb``, ``--limit-mm-per-prompt`` → ``max_images_per_request``). The image grid
follows Qwen2-VL: 14-pixel patches merged 2x2, so both sides are resized to multiples of 28 and an
image costs ``(h/28)*(w/28)`` prompt tokens, plus its ``<|vision_start|>``/``<|vision_end|>`` pair.

``--profile`` picks a named set of defaults (flags given beside it still win): ``default`` keeps
the sim's generic timing; ``tiny-qwen2vl-cpu`` is fitted to real vLLM's CPU build serving the tiny
Qwen2-VL of ``tools/tiny_qwen2vl.py`` on this machine (``benchmarks/regression/sim_fidelity.py --fit``):
same served name, context length, image limit and byte-level token counts, and its measured
timing.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from mmgate._settings import Frozen, GiB, MiB, setting

# Fitted by `benchmarks/regression/sim_fidelity.py --fit` against vLLM 0.32 (CPU) + tiny Qwen2-VL (hidden 256,
# 2 layers, vision 2x64), 2 shared cores; see docs/PERFORMANCE.md, "Sim fidelity".
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "tiny-qwen2vl-cpu": {
        "model": "tiny-qwen2vl",
        "max_model_len": 4096,
        "max_images_per_request": 8,
        "text_tokens": "bytes",
        "serial_prefill": True,
        # `benchmarks/regression/sim_fidelity.py --repeats 7 --fit`, 2026-12-01 11:44 UTC, vLLM in float32,
        # quiet machine (nothing else running).
        "request_overhead_ms": 0.0,
        "prefill_us_per_text_token": 158.29,
        "prefill_us_per_image_token": 298.11,
        "miss_us_per_image_token": 105.51,
        "sent_us_per_image_token": 29.55,
        "decode_ms_per_token": 9.389,
    },
}


class SimSettings(Frozen):
    """Everything one embedded engine needs; frozen and passed down explicitly."""

    profile: Literal["default", "tiny-qwen2vl-cpu"] = setting(
        "default", flag="--profile",
        help="named defaults: 'default', or 'tiny-qwen2vl-cpu' (fitted to real vLLM's CPU build here)")
    host: str = setting("127.0.0.1", flag="--host", help="address to bind")
    # 0: any free port (tests, and the engines `mmgate serve` embeds).
    port: int = setting(8001, flag="--port", ge=0, le=65535, help="port to bind; 0 picks a free port")
    # The served model name (vLLM's --served-model-name); requests for another name get a 404.
    model: str = setting("mmgate-sim-vl", flag="--model", min_length=1,
                         help="served model name, like vLLM's --served-model-name")

    # Processor cache (vLLM's --mm-processor-cache-gb, default 4); 0 disables it.
    mm_processor_cache_gb: float = setting(4.0, flag="--mm-processor-cache-gb", ge=0,
                                           help="processor cache size in GiB, like vLLM's flag; 0 disables it")
    # vLLM's --enable-server-load-tracking: GET /load answers {"server_load": N}, the chat requests
    # the HTTP server holds (from their body's parse to their last byte); 0 when off, as in vLLM.
    enable_server_load_tracking: bool = setting(
        False, flag="--enable-server-load-tracking",
        help="count in-flight chat requests for GET /load, like vLLM's flag (off: /load answers 0)")
    # vLLM's --enable-auto-tool-choice and --tool-call-parser. Without them vLLM refuses a chat request
    # whose tool_choice is "auto" (the default when tools are given); without a parser, "required" and
    # a named function too. The sim's model calls no tool: where vLLM would parse, the sim answers text.
    enable_auto_tool_choice: bool = setting(
        False, flag="--enable-auto-tool-choice",
        help="take tool_choice 'auto' on chat, as vLLM's flag (needs --tool-call-parser; the sim calls no tool)")
    tool_call_parser: str | None = setting(
        None, flag="--tool-call-parser", min_length=1,
        help="a tool-call parser's name, as vLLM's flag: 'required' and named tool choices are taken")
    # vLLM's --reasoning-parser: without it vLLM refuses a request with a thinking_token_budget (an
    # Anthropic Messages request with thinking enabled). The sim's model does not think: text only.
    reasoning_parser: str | None = setting(
        None, flag="--reasoning-parser", min_length=1,
        help="a reasoning parser's name, as vLLM's flag: thinking_token_budget is taken (the sim does not think)")
    # vLLM's VLLM_ENABLE_RESPONSES_API_STORE=1 (off by default, as there): stored responses for
    # previous_response_id, background mode, GET and cancel; bounded here, where vLLM's never forgets.
    responses_store_bytes: int = setting(
        0, flag="--responses-store-mb", scale=MiB, ge=0,
        help="keep Responses API responses, up to this many MiB (vLLM's VLLM_ENABLE_RESPONSES_API_STORE=1); "
             "0: none, as vLLM by default")
    # vLLM decodes an image it was sent before looking the processor cache up, so a hit that
    # carries data still pays the decode; False skips it (a cheaper, less faithful engine).
    decode_on_hit: bool = setting(True, flag="--no-decode-on-hit",
                                  help="skip decoding images that carry data but hit the cache (vLLM decodes them)")

    # Qwen2-VL-like patch grid and normalisation (OpenAI CLIP mean/std).
    patch_size: int = Field(14, ge=1, le=64)
    merge_size: int = Field(2, ge=1, le=8)
    min_pixels: int = setting(56 * 56, flag="--min-pixels", ge=1, help="smallest resized image area in pixels")
    max_pixels: int = setting(1280 * 28 * 28, flag="--max-pixels", ge=1, help="largest resized image area in pixels")
    max_aspect_ratio: float = Field(200.0, gt=1)
    image_mean: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073)
    image_std: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711)

    # Timing model. Every modelled time is divided by `speedup` (a large value ≈ no latency).
    prefill_us_per_text_token: float = setting(40.0, flag="--prefill-us-per-text-token", ge=0,
                                               help="modelled prefill time per text token, microseconds")
    prefill_us_per_image_token: float = setting(120.0, flag="--prefill-us-per-image-token", ge=0,
                                                help="modelled prefill time per image token, microseconds")
    decode_ms_per_token: float = setting(10.0, flag="--decode-ms-per-token", ge=0,
                                         help="modelled time between generated tokens, milliseconds")
    request_overhead_ms: float = setting(0.0, flag="--request-overhead-ms", ge=0,
                                         help="modelled fixed time of every request before its first token, ms")
    miss_us_per_image_token: float = setting(
        0.0, flag="--miss-us-per-image-token", ge=0,
        help="modelled extra time per image token on a processor-cache miss (vLLM's HF processor), us")
    # What an image sent with its bytes costs vLLM over a cache-only reference, hit or miss: its API
    # server parses the larger body, decodes the base64 and the image, and hashes it.
    sent_us_per_image_token: float = setting(
        0.0, flag="--sent-us-per-image-token", ge=0,
        help="modelled extra time per image token of an image sent with its bytes (parse, decode, hash), us")
    # How prompt text is counted: "estimate" (4 characters a token, 3 per message) or "bytes" (the
    # byte-level tokenizer of tools/tiny_qwen2vl.py through Qwen2-VL's chat template: exact).
    text_tokens: Literal["estimate", "bytes"] = setting(
        "estimate", flag="--text-tokens", help="prompt text counting: 'estimate' or 'bytes' (the tiny Qwen2-VL's)")
    # <|vision_start|> and <|vision_end|> around every image's tokens (Qwen2-VL's chat template).
    vision_marker_tokens: int = Field(2, ge=0)
    # Prefills of concurrent requests take turns (vLLM on a CPU: one engine step uses every core)
    # instead of each running as if alone (a GPU's batched prefill, roughly).
    serial_prefill: bool = setting(False, flag="--serial-prefill",
                                   help="concurrent requests' prefills take turns, as on a CPU")
    speedup: float = setting(1.0, flag="--speedup", gt=0,
                             help="divide every modelled time by this; large values ≈ no latency")
    # max_tokens when the request gives none (vLLM would use the rest of the context window).
    default_max_tokens: int = setting(16, flag="--default-max-tokens", ge=1,
                                      help="max_tokens when a request gives none")
    max_model_len: int = setting(131072, flag="--max-model-len", ge=16,
                                 help="context length: prompt + completion tokens")

    # Input limits.
    max_image_bytes: int = setting(20 * MiB, flag="--max-image-bytes", gt=0,
                                   help="largest encoded image accepted, bytes")
    max_image_pixels: int = Field(40_000_000, gt=0)
    max_images_per_request: int = setting(64, flag="--max-images-per-request", ge=1,
                                          help="most images in one request, like vLLM's --limit-mm-per-prompt")
    max_body_bytes: int = Field(256 * MiB, gt=0)
    # http(s) image URLs (used when a benchmark hits the engine directly).
    fetch_timeout_s: float = setting(10.0, flag="--fetch-timeout-s", gt=0,
                                     help="timeout for http(s) image URLs, seconds")
    # Threads doing image decode, resize and normalisation.
    processor_workers: int = setting(2, flag="--processor-workers", ge=1, le=64,
                                     help="threads for image decode and processing")

    @model_validator(mode="before")
    @classmethod
    def _apply_profile(cls, values: Any) -> Any:
        """The profile's values for every setting not given explicitly."""
        if isinstance(values, dict):
            profile = PROFILES.get(str(values.get("profile", "default")))
            if profile:
                return {**profile, **values}
        return values

    @model_validator(mode="after")
    def _check_grid(self) -> SimSettings:
        if self.min_pixels > self.max_pixels:
            raise ValueError("min_pixels must not exceed max_pixels")
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("--enable-auto-tool-choice requires --tool-call-parser")  # as vLLM refuses to start
        return self

    @property
    def grid_factor(self) -> int:
        """Side multiple of a resized image (patch * merge: 28 for Qwen2-VL)."""
        return self.patch_size * self.merge_size

    @property
    def cache_capacity_bytes(self) -> int:
        return int(self.mm_processor_cache_gb * GiB)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"
