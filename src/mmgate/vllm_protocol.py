"""vLLM's protocol as the three programs (gateway, ``sim``, ``bench``) meet it on the wire.

* the OpenAI/vLLM error shapes and vLLM's cache-miss answer (spelled here and nowhere else): the
  sim answers with it, the gateway heals it, the bench recognises it;
* vLLM's scheduler gauges: the sim exports them, the gateway's router polls them (a backend's load
  as every gateway puts it on it);
* Qwen2-VL's resize rule, which says how many tokens an image costs: the sim processes images by
  it, the gateway's router weighs them by it.

Pure: no I/O.
"""

from __future__ import annotations

import math
import re
from typing import Any

# vLLM's answer (HTTP 400) to a cache-only image reference that is not in its processor cache.
CACHE_MISS_STATUS = 400
CACHE_MISS_MESSAGE = "Cache miss for image at index {index} but data is not provided."
CACHE_MISS_MARKER = "but data is not provided"
_MISS_INDEX = re.compile(r"image at index (\d+)")
# The same answer for another modality (a video reference): not an image miss.
_OTHER_MISS = re.compile(r"Cache miss for (?!image )\w+ at index")


def cache_miss_message(index: int) -> str:
    """vLLM's cache-miss message for the ``index``-th image of a request."""
    return CACHE_MISS_MESSAGE.format(index=index)


def error_message(body: Any, fallback: str) -> str:
    """The message of an OpenAI-style (or older vLLM-style) error body."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if isinstance(body.get("message"), str):
            return str(body["message"])
        if isinstance(body.get("detail"), str):
            return str(body["detail"])
    return fallback


def cache_miss_index(status: int, body: Any) -> int | None:
    """The image index a vLLM cache-miss answer names (-1 if unnamed), or None for other answers.

    Both of vLLM's error-body shapes are recognised: ``{"error": {"message": ...}}`` and the older
    ``{"object": "error", "message": ...}``.
    """
    if status != CACHE_MISS_STATUS or not isinstance(body, dict):
        return None
    err = body.get("error")
    message = err.get("message") if isinstance(err, dict) else body.get("message")
    if not isinstance(message, str) or "Cache miss" not in message or CACHE_MISS_MARKER not in message:
        return None
    if _OTHER_MISS.search(message):
        return None
    found = _MISS_INDEX.search(message)
    return int(found.group(1)) if found else -1


# vLLM's scheduler gauges on /metrics (vllm/v1/metrics/loggers.py), one series per engine labelled
# model_name and engine: requests in the running batch, and requests queued for it.
RUNNING_GAUGE = "vllm:num_requests_running"
WAITING_GAUGE = "vllm:num_requests_waiting"
def smart_resize(height: int, width: int, *, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's resize rule: both sides multiples of ``factor``, area within [min, max] pixels,
    aspect ratio kept as closely as possible. Returns ``(height, width)``; sides must be positive.

    Sides smaller than ``factor`` are rounded up to it instead of being rejected. The image then
    costs ``(height // factor) * (width // factor)`` tokens (one per merged patch).
    """
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar
