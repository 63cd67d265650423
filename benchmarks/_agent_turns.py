"""What the agent-capacity benchmark sends: agent screenshots and one turn's body in each API.

A screenshot is a 1280x800 PNG of a desktop (title bar, windows of text), ~90-180 KB, the kind an
agent loop captures each step; every one differs in its pixels, so no engine or gateway cache can
hold one a run has not sent. Drawing and encoding one costs ~40-90 ms, so a run's screenshots are
made before its timed loop, in a process per core (``screenshots``).

A turn carries the agent's last ``window`` screenshots (one new each turn). ``turn_body`` writes it
for chat completions, Responses or Anthropic Messages, either resent whole (an unmodified agent)
or stripped (AIPerf's ``--uuid-and-strip``: each screenshot labelled with a uuid, its bytes sent
once, later turns a cache-only reference; chat and Responses only, vLLM's Messages takes no uuid).
"""

from __future__ import annotations

import io
import multiprocessing
import random
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pybase64
from PIL import Image, ImageDraw

WIDTH, HEIGHT = 1280, 800
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
PROMPT = "What changed on the screen since the last step? Answer briefly."
# The event of each API's stream that its first generated token brings: its time is the TTFT. Chat:
# vLLM's first chunk (the role; the token's text, often empty, beside it). Messages: `message_start`,
# which vLLM's endpoint and mmgate's mapping both send for that chunk (their first `text_delta`
# comes a decode step later, with the first non-empty text). Responses: its first text delta.
FIRST_OUTPUT = {"chat": b"data: {", "responses": b"output_text.delta", "messages": b"event: message_start"}
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


_TILES: list[Image.Image] = []  # windows of text, drawn once per process (drawing text is slow)


def _window(rng: random.Random) -> Image.Image:
    w, h = rng.randrange(250, 700), rng.randrange(150, 500)
    tile = Image.new("RGB", (w, h), tuple(rng.randrange(180, 256) for _ in range(3)))
    draw = ImageDraw.Draw(tile)
    draw.rectangle((0, 0, w - 1, h - 1), outline=(90, 90, 90))
    draw.rectangle((0, 0, w - 1, 22), fill=tuple(rng.randrange(60, 160) for _ in range(3)))
    for line in range(30, h - 12, 14):
        words = " ".join("".join(rng.choice(_LETTERS) for _ in range(rng.randrange(2, 9)))
                         for _ in range(rng.randrange(3, 12)))
        draw.text((8, line), words, fill=(20, 20, 20))
    return tile


def screenshot(seed: int) -> bytes:
    """One desktop screenshot as PNG bytes, different in its pixels for every seed: windows of text
    (from a set drawn once) at places the seed picks, a title bar naming the step."""
    if not _TILES:
        tiles = random.Random(7)
        _TILES.extend(_window(tiles) for _ in range(12))
    rng = random.Random(seed)
    img = Image.new("RGB", (WIDTH, HEIGHT), (rng.randrange(200, 256),) * 3)
    for _ in range(7):
        tile = rng.choice(_TILES)
        img.paste(tile, (rng.randrange(0, WIDTH - 200), rng.randrange(30, HEIGHT - 120)))
    draw = ImageDraw.Draw(img)
    draw.rectangle((0, 0, WIDTH, 28), fill=(40, 44, 52))
    draw.text((8, 8), f"step {seed}", fill=(230, 230, 230))
    x = rng.randrange(0, WIDTH - 200)
    draw.rectangle((x, 40, x + 160, 70), fill=tuple(rng.randrange(0, 256) for _ in range(3)))  # a changed widget
    out = io.BytesIO()
    img.save(out, "PNG")
    return out.getvalue()


def _encoded(seed: int) -> str:
    return pybase64.b64encode_as_string(screenshot(seed))


def screenshots(seeds: Sequence[int], workers: int = 2) -> list[str]:
    """The base64 text of one screenshot per seed, made in ``workers`` processes."""
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        return list(pool.map(_encoded, seeds, chunksize=8))


def _image_part(api: str, b64: str | None, uuid: str | None) -> dict[str, Any]:
    """One screenshot in ``api``'s part shape: with its bytes, or (``b64`` None) a reference."""
    url = None if b64 is None else "data:image/png;base64," + b64
    if api == "chat":
        part: dict[str, Any] = {"type": "image_url", "image_url": None if url is None else {"url": url}}
    elif api == "responses":
        part = {"type": "input_image", "image_url": url, "detail": "auto"}
    else:
        assert b64 is not None and uuid is None, "vLLM's Messages API takes no uuid"
        return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}
    if uuid is not None:
        part["uuid"] = uuid
    return part


def turn_body(api: str, model: str, window: list[tuple[str, str]], sent: set[str] | None,
              max_tokens: int) -> dict[str, Any]:
    """One turn's request body: ``window`` is the agent's (uuid, base64) screenshots, oldest
    first; ``sent`` the uuids already sent with bytes (a stripping client, updated here), or None
    (an unmodified client: every screenshot's bytes, no uuid)."""
    parts = []
    for uuid, b64 in window:
        if sent is None:
            parts.append(_image_part(api, b64, None))
        elif uuid in sent:
            parts.append(_image_part(api, None, uuid))
        else:
            sent.add(uuid)
            parts.append(_image_part(api, b64, uuid))
    if api == "chat":
        return {"model": model, "stream": True, "max_tokens": max_tokens, "temperature": 0,
                "messages": [{"role": "user", "content": [{"type": "text", "text": PROMPT}, *parts]}]}
    if api == "responses":
        return {"model": model, "stream": True, "max_output_tokens": max_tokens, "temperature": 0, "store": False,
                "input": [{"role": "user", "content": [{"type": "input_text", "text": PROMPT}, *parts]}]}
    return {"model": model, "stream": True, "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": [{"type": "text", "text": PROMPT}, *parts]}]}
