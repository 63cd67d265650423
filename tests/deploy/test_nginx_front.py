"""nginx in front of mmgate with the shipped configuration (deploy/nginx/, docs/DEPLOY.md "nginx in
front"): a real nginx, a real ``mmgate serve`` and a real ``mmgate sim`` on loopback. A streamed chat
reaches the client chunk by chunk (not buffered into one reply), the gateway's JSON errors pass
through unchanged, nginx's own 413 (a body over ``client_max_body_size``) has the same shape, and a
client that leaves mid-stream cancels the gateway's request (499)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.support.nginx import nginx_binary, nginx_in_front
from tests.support.serve_process import GatewayProcess, metric_value, serve_process
from tests.support.vllm import SERVED_MODEL, SimProcess

pytestmark = pytest.mark.skipif(
    nginx_binary() is None, reason="nginx is not installed (make install-test installs Debian's as root; "
    "else apt-get install nginx-light)")

GATEWAY_MAX_BODY = 100_000


@pytest.fixture
def front(tmp_path: Path) -> Iterator[tuple[str, GatewayProcess]]:
    """nginx's URL and the gateway behind it (a sim at its real token pace behind that)."""
    sim = SimProcess(tmp_path / "sim.log")
    sim.start(["--speedup", "1"])
    try:
        with serve_process(tmp_path, "--backend", f"vllm={sim.url}", "--max-body-bytes", str(GATEWAY_MAX_BODY)) as gw:
            (tmp_path / "nginx").mkdir()
            with nginx_in_front(tmp_path / "nginx", gw.port) as (_, port):
                yield f"http://127.0.0.1:{port}", gw
    finally:
        sim.stop()


def chat(max_tokens: int, stream: bool) -> dict[str, object]:
    return {"model": SERVED_MODEL, "max_tokens": max_tokens, "ignore_eos": True, "stream": stream,
            "messages": [{"role": "user", "content": "hello"}]}


async def test_a_streamed_chat_arrives_chunk_by_chunk_through_nginx(front: tuple[str, GatewayProcess]) -> None:
    url, gw = front
    async with aiohttp.ClientSession() as s:
        started = time.perf_counter()
        async with s.post(url + "/v1/chat/completions", json=chat(40, True)) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
            arrivals: list[tuple[float, bytes]] = []
            async for chunk in r.content.iter_any():
                arrivals.append((time.perf_counter() - started, chunk))
        body = b"".join(c for _, c in arrivals)
        events = [line[6:] for line in body.split(b"\n") if line.startswith(b"data: ")]
        assert events[-1] == b"[DONE]"
        tokens = [e for e in events[:-1] if orjson.loads(e)["choices"] and orjson.loads(e)["choices"][0]["delta"].get("content")]
        assert len(tokens) == 40
        # Unbuffered: the first token reached the client well before the last one was generated.
        first = next(t for t, c in arrivals if b'"content"' in c)
        assert len(arrivals) > 5 and arrivals[-1][0] - first > 0.2, [t for t, _ in arrivals]
        # The same answer as from the gateway directly (the sim's text is deterministic).
        async with s.post(gw.url + "/v1/chat/completions", json=chat(40, False)) as direct, \
                s.post(url + "/v1/chat/completions", json=chat(40, False)) as proxied:
            assert (direct.status, proxied.status) == (200, 200)
            text = [orjson.loads(await x.read())["choices"][0]["message"]["content"] for x in (direct, proxied)]
            assert text[0] == text[1] and text[0]


async def test_the_gateways_413_passes_through_and_nginxs_own_has_its_shape(front: tuple[str, GatewayProcess]) -> None:
    url, _ = front
    over = {**chat(1, False), "padding": "x" * GATEWAY_MAX_BODY}
    async with aiohttp.ClientSession() as s:
        async with s.post(url + "/v1/chat/completions", json=over) as r:
            error = orjson.loads(await r.read())["error"]
            assert r.status == 413 and error["code"] == "request_too_large"
            assert f"{GATEWAY_MAX_BODY}-byte limit" in error["message"]  # the gateway's own answer
        # Past client_max_body_size (256m): refused by nginx from the Content-Length, no body sent.
        async with s.post(url + "/v1/chat/completions", data=b"",
                          headers={"Content-Length": str(300 << 20), "Content-Type": "application/json"},
                          skip_auto_headers=("Content-Length",)) as r:
            assert r.status == 413 and r.headers["Content-Type"] == "application/json"
            error = orjson.loads(await r.read())["error"]
            assert error["code"] == "request_too_large" and error["type"] == "invalid_request_error"
        # A malformed body is the gateway's 400, untouched.
        async with s.post(url + "/v1/chat/completions", data=b"{not json",
                          headers={"Content-Type": "application/json"}) as r:
            assert r.status == 400 and orjson.loads(await r.read())["error"]["type"] == "invalid_request_error"


async def test_a_client_that_leaves_mid_stream_cancels_the_request_behind_nginx(front: tuple[str, GatewayProcess]) -> None:
    url, gw = front
    port = int(url.rsplit(":", 1)[1])
    body = orjson.dumps(chat(2000, True))  # 20 s of tokens at the sim's pace
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    await writer.drain()
    await asyncio.wait_for(reader.readuntil(b"data: "), 10)  # the stream has started
    writer.transport.abort()
    deadline = time.monotonic() + 5
    while metric_value(gw.metrics(), "mmgate_requests_total", route="/v1/chat/completions", status="499") < 1:
        assert time.monotonic() < deadline, "the gateway did not see the client leave"
        await asyncio.sleep(0.1)
