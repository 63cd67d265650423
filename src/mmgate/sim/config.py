"""Settings of the embedded vLLM-like engine (``mmgate sim``), a stand-in for vLLM, not a model.

Names follow vLLM's flags where one exists (``--served-model-name`` → ``model``,
``--mm-processor-cache-gb``, ``--limit-mm-per-prompt`` → ``max_images_per_request``). The image grid
follows Qwen2-VL: 14-pixel patches merged 2x2, so both sides are resized to multiples of 28 and an
image costs ``(h/28)*(w/28)`` prompt tokens.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from mmgate.config import GiB, MiB, _Frozen


class SimSettings(_Frozen):
    """Everything one embedded engine needs; frozen and passed down explicitly."""

    host: str = "127.0.0.1"
    # 0: any free port (tests, and the engines `mmgate serve` embeds).
    port: int = Field(8001, ge=0, le=65535)
    # The served model name (vLLM's --served-model-name); requests for another name get a 404.
    model: str = Field("mmgate-sim-vl", min_length=1)

    # Processor cache (vLLM's --mm-processor-cache-gb, default 4); 0 disables it.
    mm_processor_cache_gb: float = Field(4.0, ge=0)
    # vLLM decodes an image it was sent before looking the processor cache up, so a hit that
    # carries data still pays the decode; False skips it (a cheaper, less faithful engine).
    decode_on_hit: bool = True

    # Qwen2-VL-like patch grid and normalisation (OpenAI CLIP mean/std).
    patch_size: int = Field(14, ge=1, le=64)
    merge_size: int = Field(2, ge=1, le=8)
    min_pixels: int = Field(56 * 56, ge=1)
    max_pixels: int = Field(1280 * 28 * 28, ge=1)
    max_aspect_ratio: float = Field(200.0, gt=1)
    image_mean: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073)
    image_std: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711)

    # Timing model. Every modelled time is divided by `speedup` (a large value ≈ no latency).
    prefill_us_per_text_token: float = Field(40.0, ge=0)
    prefill_us_per_image_token: float = Field(120.0, ge=0)
    decode_ms_per_token: float = Field(10.0, ge=0)
    speedup: float = Field(1.0, gt=0)
    # max_tokens when the request gives none (vLLM would use the rest of the context window).
    default_max_tokens: int = Field(16, ge=1)
    max_model_len: int = Field(131072, ge=16)

    # Input limits.
    max_image_bytes: int = Field(20 * MiB, gt=0)
    max_image_pixels: int = Field(40_000_000, gt=0)
    max_images_per_request: int = Field(64, ge=1)
    max_body_bytes: int = Field(256 * MiB, gt=0)
    # http(s) image URLs (used when a benchmark hits the engine directly).
    fetch_timeout_s: float = Field(10.0, gt=0)
    # Threads doing image decode, resize and normalisation.
    processor_workers: int = Field(2, ge=1, le=64)

    @model_validator(mode="after")
    def _check_grid(self) -> SimSettings:
        if self.min_pixels > self.max_pixels:
            raise ValueError("min_pixels must not exceed max_pixels")
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
