"""Garbage for fuzz tests: JSON bodies mutated at random with values and keys that every part shape a
vLLM parser acts on would meet (media keys, part types, uuids, URLs of every scheme)."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

JUNK: list[Any] = [
    None, True, 0, -1, 2**70, 1.5e308, "", "x" * 300, "data:image/png;base64,", "data:text/html;base64,PGI+",
    "http://[::1]/x.png", "file:///etc/passwd", "gopher://x", [], {}, [None], {"url": None}, {"uuid": 5},
    "data:image/png;base64," + "A" * 4096, "\u0000\ud800", {"url": "data:image/png;base64,iVBORw0KGgo="},
    "input_image", "image_pil", "image_embeds", "video_url", "audio_url", "input_audio", "tool_reference",
    "thinking", "prompt_embeds", "http://127.0.0.1:1/secret", {"url": "http://169.254.169.254/"},
    {"data": "AA==", "format": "wav"}, "~sha256:" + "0" * 64,
]
MEDIA_KEYS = ["uuid", "image_url", "type", "zzz", "image_pil", "image_embeds", "audio_embeds", "video_embeds",
              "prompt_embeds", "video_url", "audio_url", "input_audio", "input_image", "file_id", "detail"]


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += paths(v, (*prefix, i))
    return out


def mutate(rng: random.Random, body: dict[str, Any]) -> bytes:
    """``body`` (mutated in place) with 1-3 random mutations, as JSON bytes (sometimes truncated, or empty)."""
    for _ in range(rng.randint(1, 3)):
        target = rng.choice(paths(body)[1:])
        parent = body
        for key in target[:-1]:
            parent = parent[key]
        action = rng.random()
        if action < 0.6:
            parent[target[-1]] = copy.deepcopy(rng.choice(JUNK))
        elif action < 0.8 and isinstance(parent, dict):
            del parent[target[-1]]
        elif isinstance(parent, dict):
            parent[rng.choice(MEDIA_KEYS)] = copy.deepcopy(rng.choice(JUNK))
    # The stdlib writes what orjson refuses to (lone surrogates, ints past 64 bits): more garbage.
    raw = json.dumps(body).encode() if rng.random() < 0.9 else b""
    if rng.random() < 0.1:
        cut = rng.randrange(1, max(2, len(raw)))
        raw = raw[:cut]  # truncated JSON
    return raw
