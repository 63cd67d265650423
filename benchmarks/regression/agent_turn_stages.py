"""The gateway's work on one agent turn, stage by stage, in one process: what each step of the
pipeline costs for a turn of one new 1280x800 PNG screenshot and three repeats, on each API.

Stages, with the gateway's own functions (``_agent_turns`` makes the bodies):

* parse      the API's parse, as its handler does it: chat (``parse_chat_request_async``), Responses
             (``loads_body`` + its rewrite's parser), Messages (``loads_body``, its checks, the
             mapping onto chat, the chat parser), each taking the repeats for the held screenshots
             (``MediaLoader.held_images``)
* repeat     ``MediaLoader.load`` of a screenshot the gateway holds, given the held text as chat's
             parse gives it (its fingerprint, a local-cache hit, an identity compare), per image
* new        ``MediaLoader.load`` of a screenshot it has not seen (base64 decode, SHA-256 of the
             bytes, the PNG probe and CRC check, the data URL), per image
* plan+body  reuse plan, rendering and the forwarded body's JSON
* decode     for comparison: a full Pillow decode of the screenshot (what ``new`` did before
             PNGs were checked by their CRCs)

Each stage's median of ``--repeats`` runs (wall time; the event loop is idle otherwise, so it is
the stage's cost). The gateway's whole CPU per turn, HTTP included, is in
``benchmarks/regression/agent_capacity.py``'s table.

    .venv/bin/python benchmarks/regression/agent_turn_stages.py --repeats 200 --out results/agent_turn_stages.json
"""

from __future__ import annotations

import argparse
import asyncio
import io
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from PIL import Image

from benchmarks._agent_turns import screenshots, turn_body
from benchmarks._run import parse_args, write_results
from benchmarks._table import Column, print_table
from mmgate.anthropic_chat.request import check_messages_body, to_chat_body
from mmgate.api.chat_request import ChatRequest, parse_chat_body, parse_chat_request_async
from mmgate.api.openai_responses.parse import parse_responses_body
from mmgate.config import CacheSettings, MediaSettings
from mmgate.jsonbody import dumps_body, loads_body
from mmgate.media import MediaLoader
from mmgate.media.repeats import HeldImages
from mmgate.reuse import KeySpace, UUIDStore, plan_slots, render

QUICK = {"repeats": 3}


async def parse(api: str, raw: bytes, held: HeldImages) -> ChatRequest:
    """The API's parse, as its handler does it (the loop given back between a large body's big
    strings; chat's and Responses' repeats taken for the held screenshots, ``held``)."""
    if api == "chat":
        return await parse_chat_request_async(raw, max_images=16, max_uuid_length=256, held=held)
    body = await loads_body(raw, held)
    if api == "responses":
        return parse_responses_body(body, max_images=16, max_uuid_length=256, max_depth=64).chat
    check_messages_body(body)
    chat, _ = to_chat_body(body, held=held.data_url)
    return parse_chat_body(chat, max_images=16, max_uuid_length=256, max_depth=64)


async def timed(fn: Callable[[], Awaitable[object]], repeats: int) -> float:
    """Median microseconds of ``await fn()``."""
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - started)
    return 1e6 * statistics.median(samples)


async def measure(api: str, shots: list[str], fresh: list[str], repeats: int) -> dict[str, Any]:
    loader = MediaLoader(MediaSettings(), CacheSettings())
    store = UUIDStore(64 << 20, ttl_s=3600)
    try:
        window = [(f"a-{i}", s) for i, s in enumerate(shots)]
        raw = orjson.dumps(turn_body(api, "m", window, None, 4))
        urls = ["data:image/png;base64," + s for s in shots]
        for url in urls[:-1]:
            await loader.load(url)  # the repeats: held from earlier turns
        row: dict[str, Any] = {"api": api, "body_kib": len(raw) / 1024}

        async def parsed() -> None:
            await parse(api, raw, loader.held_images(None, None))  # one a request, as the gateway's
        row["parse"] = await timed(parsed, repeats)

        async def repeat() -> None:
            await loader.load(urls[0])
        row["repeat"] = await timed(repeat, repeats)
        news = iter(fresh)

        async def new() -> None:
            await loader.load("data:image/png;base64," + next(news))
        row["new"] = await timed(new, min(repeats, len(fresh)))
        images = {i: await loader.load(url) for i, url in enumerate(urls)}
        keys = KeySpace()

        samples = []
        for _ in range(repeats):
            request = await parse(api, raw, loader.held_images(None, None))  # rendering rewrites the parts: a fresh parse each time
            started = time.perf_counter()
            plans = plan_slots(store, request.slots, images, keys, None)
            render(plans, with_uuid=True, already_sent={p.key for p in plans[:-1]})
            await dumps_body(request.body)
            samples.append(time.perf_counter() - started)
        row["plan_body"] = 1e6 * statistics.median(samples)
        data = images[0].data

        async def decode() -> None:
            with Image.open(io.BytesIO(data)) as img:
                img.load()
        row["decode"] = await timed(decode, max(10, repeats // 10))
        row["turn"] = row["parse"] + 3 * row["repeat"] + row["new"] + row["plan_body"]
        return row
    finally:
        await loader.close()


COLUMNS = [
    Column("api", 11, lambda r: r["api"], left=True),
    Column("body KiB", 10, lambda r: f"{r['body_kib']:.0f}"),
    Column("parse µs", 10, lambda r: f"{r['parse']:.0f}"),
    Column("repeat µs", 11, lambda r: f"{r['repeat']:.0f}"),
    Column("new µs", 9, lambda r: f"{r['new']:.0f}"),
    Column("plan+body µs", 14, lambda r: f"{r['plan_body']:.0f}"),
    Column("turn µs", 9, lambda r: f"{r['turn']:.0f}"),
    Column("full decode µs", 16, lambda r: f"{r['decode']:.0f}"),
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--apis", default="chat,responses,messages")
    p.add_argument("--out", type=Path)
    args = parse_args(p, QUICK)
    apis = args.apis.split(",")
    shots = screenshots(range(1, 5))
    fresh = screenshots(range(1000, 1000 + min(args.repeats, 60) * len(apis)))
    rows = []
    for n, api in enumerate(apis):
        mine = fresh[n * len(fresh) // len(apis):(n + 1) * len(fresh) // len(apis)]
        rows.append(asyncio.run(measure(api, shots, mine, args.repeats)))
    print_table(COLUMNS, rows)
    print("turn = parse + 3 x repeat + new + plan+body (median µs of each; HTTP not included)")
    if args.out:
        write_results(args.out, {"args": vars(args), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
