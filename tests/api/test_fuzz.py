"""Fuzz the gateway with garbage: random mutations of a valid multimodal request and raw junk bytes,
sent for real over loopback. Every answer must be a 2xx or an OpenAI-style 4xx — never a 5xx, never
a crash — and afterwards the gateway still serves the valid request with the right image."""

from __future__ import annotations

import base64
import copy
import io
import json
import random
from typing import Any

import aiohttp
import orjson
from PIL import Image

from tests.support.gateway import gateway_settings, running_gateway, running_sims, vllm_specs
from tests.support.recorder import recording_proxy

MODEL = "mmgate-sim-vl"
SEED = 20261129


def png(seed: int) -> str:
    img = Image.new("RGB", (40, 30), (seed % 256, 10, 200))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def valid_request() -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 4,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": png(1)}, "uuid": "fz-1"},
                {"type": "image_url", "image_url": None, "uuid": "fz-1"},
            ]},
        ],
    }


JUNK: list[Any] = [
    None, True, 0, -1, 2**70, 1.5e308, "", "x" * 300, "data:image/png;base64,", "data:text/html;base64,PGI+",
    "http://[::1]/x.png", "file:///etc/passwd", "gopher://x", [], {}, [None], {"url": None}, {"uuid": 5},
    "data:image/png;base64," + "A" * 4096, "\u0000\ud800", {"url": "data:image/png;base64,iVBORw0KGgo="},
]


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += paths(v, (*prefix, i))
    return out


def mutate(rng: random.Random) -> bytes:
    body = valid_request()
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
            parent[rng.choice(["uuid", "image_url", "type", "zzz"])] = copy.deepcopy(rng.choice(JUNK))
    # The stdlib writes what orjson refuses to (lone surrogates, ints past 64 bits): more garbage.
    raw = json.dumps(body).encode() if rng.random() < 0.9 else b""
    if rng.random() < 0.1:
        cut = rng.randrange(1, max(2, len(raw)))
        raw = raw[:cut]  # truncated JSON
    return raw


async def test_mutated_requests_and_junk_never_5xx_and_poison_nothing() -> None:
    rng = random.Random(SEED)
    async with running_sims(1) as sims, recording_proxy(sims[0].url) as rec:
        async with running_gateway(gateway_settings(backends=vllm_specs([rec]))) as gw, aiohttp.ClientSession() as s:
            url = gw.url + "/v1/chat/completions"
            statuses: dict[int, int] = {}
            bodies = [mutate(rng) for _ in range(1500)]
            bodies += [rng.randbytes(rng.randint(0, 2000)) for _ in range(50)]
            bodies += [b"\xff\xfe{", b"[]", b"null", b'{"model": "mmgate-sim-vl", "messages": {}}']
            for raw in bodies:
                async with s.post(url, data=raw, headers={"Content-Type": "application/json"}) as r:
                    text = await r.read()
                    statuses[r.status] = statuses.get(r.status, 0) + 1
                    assert r.status < 500, (r.status, raw[:200], text[:300])
                    if r.status >= 400:
                        err = orjson.loads(text)["error"]
                        assert err["message"] and err["type"]
            assert statuses.get(400, 0) > 500  # the garbage really was garbage
            # Still alive, and the valid request still sends the right bytes for fz-1.
            async with s.post(url, json=valid_request()) as r:
                assert r.status == 200, await r.text()
            # Garbage sent under uuid fz-1 never replaced the validated image the gateway holds.
            stored = gw.gateway.store.peek("fz-1")
            assert stored is not None and stored.data_url() == png(1)
            async with s.post(url, json={"model": MODEL, "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": None, "uuid": "fz-1"}]}]}) as r:
                assert r.status == 200


async def test_the_embedded_engine_survives_the_same_garbage() -> None:
    rng = random.Random(SEED + 1)
    async with running_sims(1) as sims, aiohttp.ClientSession() as s:
        url = sims[0].url + "/v1/chat/completions"
        for raw in [mutate(rng) for _ in range(800)] + [rng.randbytes(rng.randint(0, 500)) for _ in range(50)]:
            async with s.post(url, data=raw, headers={"Content-Type": "application/json"}) as r:
                assert r.status < 500, (r.status, raw[:200], (await r.read())[:300])
        async with s.post(url, json=valid_request()) as r:
            assert r.status == 200
