"""A very large body (parsed and written in pieces, ``mmgate.jsonbody``; read and sent to the backend
in pieces) reaches the backend as the client meant it, through a real ``mmgate serve`` process,
whatever JSON spelling hides around its big strings; a broken one is a 400, as a small one is."""

from __future__ import annotations

import base64
import io
import random
from pathlib import Path

import aiohttp
import orjson
from PIL import Image

from tests.support.gateway import running_sims
from tests.support.recorder import recording_proxy
from tests.support.serve_process import serve_process


def noise_png(side: int, seed: int) -> str:
    img = Image.frombytes("RGB", (side, side), random.Random(seed).randbytes(side * side * 3))
    buf = io.BytesIO()
    img.save(buf, "PNG", compress_level=0)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


async def post(url: str, raw: bytes) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as s, s.post(
            url + "/v1/chat/completions", data=raw, headers={"Content-Type": "application/json"}) as r:
        return r.status, await r.json(content_type=None)


async def test_a_large_body_reaches_the_backend_as_sent(tmp_path: Path) -> None:
    urls = [noise_png(300, seed) for seed in range(8)]  # ~360 KB each: a 2.9 MB body
    text = 'see "data:image/png;base64,AAAA" and \\"data:x\\" / é'
    body = {"model": "mmgate-sim-vl", "max_tokens": 1, "extra_field": {"deep": [urls[0][:70_000]]},
            "messages": [{"role": "user", "content": [{"type": "text", "text": text},
                                                       *({"type": "image_url", "image_url": {"url": u}} for u in urls)]}]}
    raw = orjson.dumps(body)
    # Another writer's spelling: spaces around separators, escaped slashes inside the big strings.
    raw = raw.replace(b'":', b'" : ').replace(b'/', b'\\/')
    assert len(raw) > 2 << 20 and orjson.loads(raw) == body
    async with running_sims(1) as sims, recording_proxy(sims[0].url) as rec:
        with serve_process(tmp_path, "--backend", f"vllm={rec.url}") as gw:
            status, answer = await post(gw.url, raw)
            assert status == 200, answer
            sent = rec.bodies[-1]
            assert sent["extra_field"] == body["extra_field"]
            assert sent["messages"][0]["content"][0] == {"type": "text", "text": text}
            assert [p["image_url"]["url"] for p in rec.image_parts()] == urls
            assert rec.headers[-1].get("Content-Length") and "Transfer-Encoding" not in rec.headers[-1]
            # Broken next to a big string: the same 400 a small body gets.
            status, answer = await post(gw.url, raw.replace(b'"data:', b'data:', 1))
            assert status == 400 and "not valid JSON" in str(answer), answer
