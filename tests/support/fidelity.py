"""One corpus of requests sent to an engine — real vLLM or ``mmgate sim`` — to compare what each
answers: status, error body, processor-cache counters, usage (image tokens included), ``n``,
and whether sent bytes are decoded before the cache lookup.

``run_corpus(engine)`` sends every case in order (cases build on earlier ones: a uuid seeded by
one is referenced by the next) and returns one ``Outcome`` per case. Each case uses uuids and
images of its own run (``tag``), so a corpus can run twice against the same engine.
``tests/vllm/test_sim_fidelity.py`` asserts sim == vLLM case by case;
``benchmarks/regression/sim_fidelity.py`` prints them side by side.
"""

from __future__ import annotations

import base64
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import aiohttp

from tests.support.images import make_image

TIMEOUT = aiohttp.ClientTimeout(total=120, sock_connect=10)
_runs = itertools.count(1)


class Engine(Protocol):
    @property
    def url(self) -> str: ...

    model: str

    def cache_counters(self) -> tuple[float, float]: ...


@dataclass
class Outcome:
    """What one case got: status, the error body or the usage/choices, the counters' moves."""

    case: str
    status: int
    error: dict[str, Any] | None
    usage: dict[str, int] | None
    choices: int
    queries: float
    hits: float

    def comparable(self) -> dict[str, Any]:
        """Everything the sim claims to mimic (not ids, timestamps or generated text)."""
        return asdict(self)


def jpeg_url(side: int, seed: int) -> str:
    data = make_image("JPEG", side, side, seed=seed, noise=0.5)
    return "data:image/jpeg;base64," + base64.b64encode(data).decode()


def image(url: str | None, uuid: str | None = None, **extra: Any) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "image_url", "image_url": {"url": url} if url is not None else None}
    if uuid is not None:
        part["uuid"] = uuid
    return {**part, **extra}


Case = tuple[str, Callable[[str, str, int], dict[str, Any]]]


def _body(model: str, *parts: dict[str, Any], text: str = "Describe the image.", **extra: Any) -> dict[str, Any]:
    return {"model": model, "max_tokens": 3, "ignore_eos": True,
            "messages": [{"role": "user", "content": [{"type": "text", "text": text}, *parts]}], **extra}


TOOLS = [{"type": "function", "function": {"name": "click", "description": "Click a point.", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}}}}]
CLICK = {"type": "function", "function": {"name": "click"}}
GARBAGE = "data:image/jpeg;base64," + base64.b64encode(b"not an image at all").decode()

# (name, build(model, tag, seed) -> body). Order matters: "seed" fills uuid {tag}-a.
CASES: list[Case] = [
    ("text only", lambda m, t, s: _body(m)),
    ("text only, string content", lambda m, t, s: {"model": m, "max_tokens": 3, "ignore_eos": True,
                                                   "messages": [{"role": "user", "content": "Hello there"}]}),
    ("system + user + assistant + user", lambda m, t, s: {
        "model": m, "max_tokens": 3, "ignore_eos": True, "messages": [
            {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Again"}]}),
    ("seed: 224px image with uuid (miss)", lambda m, t, s: _body(m, image(jpeg_url(224, s), f"{t}-a"))),
    ("cache-only reference (hit)", lambda m, t, s: _body(m, image(None, f"{t}-a"))),
    ("image_url {} reference (hit)", lambda m, t, s: _body(m, {"type": "image_url", "image_url": {}, "uuid": f"{t}-a"})),
    ("image_url {url: ''} reference (hit)",
     lambda m, t, s: _body(m, {"type": "image_url", "image_url": {"url": ""}, "uuid": f"{t}-a"})),
    ("no image_url key, uuid only", lambda m, t, s: _body(m, {"type": "image_url", "uuid": f"{t}-a"})),
    ("same bytes, same uuid again (hit with data)", lambda m, t, s: _body(m, image(jpeg_url(224, s), f"{t}-a"))),
    ("undecodable bytes under a cached uuid", lambda m, t, s: _body(m, image(GARBAGE, f"{t}-a"))),
    ("undecodable bytes, no uuid", lambda m, t, s: _body(m, image(GARBAGE))),
    ("unknown uuid reference (miss)", lambda m, t, s: _body(m, image(None, f"{t}-unknown"))),
    ("known + unknown reference", lambda m, t, s: _body(m, image(None, f"{t}-a"), image(None, f"{t}-zz"))),
    ("new image + its own reference in one request",
     lambda m, t, s: _body(m, image(jpeg_url(224, s + 1), f"{t}-b"), image(None, f"{t}-b"))),
    ("empty uuid with data", lambda m, t, s: _body(m, image(jpeg_url(224, s + 2), ""))),
    ("empty uuid without data", lambda m, t, s: _body(m, image(None, ""))),
    ("image without uuid (content hash, miss)", lambda m, t, s: _body(m, image(jpeg_url(224, s + 3)))),
    ("same image without uuid again (hit)", lambda m, t, s: _body(m, image(jpeg_url(224, s + 3)))),
    ("512px image", lambda m, t, s: _body(m, image(jpeg_url(512, s + 4)))),
    ("768px image", lambda m, t, s: _body(m, image(jpeg_url(768, s + 5)))),
    ("300x200 image", lambda m, t, s: _body(m, image("data:image/jpeg;base64," + base64.b64encode(
        make_image("JPEG", 300, 200, seed=s + 6)).decode()))),
    ("two images", lambda m, t, s: _body(m, image(jpeg_url(224, s + 7)), image(None, f"{t}-a"))),
    ("9 images (limit 8)", lambda m, t, s: _body(m, *[image(None, f"{t}-a")] * 9)),
    ("n=2", lambda m, t, s: _body(m, n=2)),
    ("n=2 with image", lambda m, t, s: _body(m, image(None, f"{t}-a"), n=2)),
    ("max_tokens over max_model_len", lambda m, t, s: _body(m, max_tokens=5000)),
    # 5 x 768px + 512px = 4,057 prompt tokens: max_tokens 100 is clipped to the 39 left.
    ("prompt + max_tokens over max_model_len", lambda m, t, s: _body(
        m, *[image(jpeg_url(768, s + 20 + i)) for i in range(5)], image(jpeg_url(512, s + 25)), max_tokens=100)),
    ("prompt over max_model_len (6 x 768px)",
     lambda m, t, s: _body(m, *[image(jpeg_url(768, s + 10 + i)) for i in range(6)])),
    ("n=2 streamed", lambda m, t, s: _body(m, n=2, stream=True, stream_options={"include_usage": True})),
    ("unknown model", lambda m, t, s: {**_body(m), "model": "no-such-model"}),
    ("stream with include_usage", lambda m, t, s: _body(m, image(None, f"{t}-a"), stream=True,
                                                       stream_options={"include_usage": True})),
    # Tools on an engine without --enable-auto-tool-choice or --tool-call-parser (vLLM's default).
    ("tools, no tool_choice (auto)", lambda m, t, s: _body(m, tools=TOOLS)),
    ("tools, tool_choice auto, streamed", lambda m, t, s: _body(m, tools=TOOLS, tool_choice="auto", stream=True)),
    ("tools, tool_choice none", lambda m, t, s: _body(m, tools=TOOLS, tool_choice="none")),
    ("tools, tool_choice required", lambda m, t, s: _body(m, tools=TOOLS, tool_choice="required")),
    ("tools, a named function", lambda m, t, s: _body(m, tools=TOOLS, tool_choice=CLICK)),
    ("tools, an unknown named function", lambda m, t, s: _body(
        m, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "scroll"}})),
    ("tool_choice without tools", lambda m, t, s: _body(m, tool_choice="required")),
    # An Anthropic client's extended thinking, mapped: refused by an engine without --reasoning-parser.
    ("thinking_token_budget without a reasoning parser", lambda m, t, s: _body(m, thinking_token_budget=1024)),
]


async def _send(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with http.post(url + "/v1/chat/completions", json=body) as resp:
        if resp.content_type == "text/event-stream":
            import orjson

            events = [orjson.loads(line[6:]) for line in (await resp.text()).splitlines()
                      if line.startswith("data: {")]
            usage = next((e["usage"] for e in reversed(events) if e.get("usage")), None)
            indices = {c["index"] for e in events for c in e.get("choices", [])}
            return resp.status, {"usage": usage, "choices": [{"index": i} for i in sorted(indices)]}
        return resp.status, await resp.json(content_type=None)


async def run_corpus(engine: Engine, *, counters: Callable[[], Awaitable[tuple[float, float]]] | None = None
                     ) -> list[Outcome]:
    """Every case against ``engine`` in order; counters are read before and after each case."""
    run = next(_runs)
    tag, seed = f"fid{run}", 5000 + 100 * run
    read = counters
    if read is None:
        import asyncio

        async def read() -> tuple[float, float]:
            return await asyncio.to_thread(engine.cache_counters)
    out = []
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        # vLLM publishes cache counters with its next engine step: one request first, so nothing
        # an earlier client left unpublished lands on the first case.
        await _send(http, engine.url, _body(engine.model))
        for name, build in CASES:
            q0, h0 = await read()
            status, answer = await _send(http, engine.url, build(engine.model, tag, seed))
            q1, h1 = await read()
            error = answer.get("error") if isinstance(answer, dict) and status != 200 else None
            usage = answer.get("usage") if status == 200 else None
            if usage is not None:
                usage = {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
            choices = len(answer.get("choices", [])) if status == 200 else 0
            out.append(Outcome(name, status, error, usage, choices, q1 - q0, h1 - h0))
    return out
