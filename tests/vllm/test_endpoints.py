"""Every client-facing endpoint against the session's two real vLLM replicas: direct vs through
the gateway, the same status and the same body apart from the gateway's own headers (ids and
timestamps normalised); and a bad-input corpus per endpoint: a precise 4xx, never a 500.

Each request goes through the gateway first and then straight to the replica the gateway chose
(``x-mmgate-backend``), so both answers come from the same engine.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from tests.support.vllm import SERVED_MODEL, GatewayProcess, VllmReplica
from tests.vllm.helpers import fresh_jpeg

M = SERVED_MODEL
# Bounded, and generous: the CPU replicas share a busy machine.
TIMEOUT = aiohttp.ClientTimeout(total=240, sock_connect=10)
IMAGE = fresh_jpeg(64)
POOLING = ("/v1/embeddings", "/pooling", "/classify", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank")

CORPUS: list[tuple[str, str, Any]] = [
    ("POST", "/v1/completions", {"model": M, "prompt": "Hello", "max_tokens": 3, "temperature": 0}),
    ("POST", "/v1/completions", {"model": M, "prompt": ["a b", "c d"], "max_tokens": 3, "temperature": 0,
                                 "logprobs": 2}),
    ("POST", "/v1/completions", {"prompt": "no model named", "max_tokens": 3, "temperature": 0}),
    ("POST", "/v1/completions", {"model": M, "prompt": [1, 2, 3], "max_tokens": 3, "temperature": 0, "echo": True}),
    ("POST", "/v1/completions", {"model": M, "prompt": "x", "max_tokens": 2, "temperature": 0, "n": 2,
                                 "stop": ["\n"]}),
    ("POST", "/v1/completions", {"model": M, "prompt": "Hello", "max_tokens": 3, "temperature": 0, "stream": True,
                                 "stream_options": {"include_usage": True}}),
    ("POST", "/v1/completions", {"model": M, "prompt": "x", "max_tokens": -1}),
    ("POST", "/v1/completions", {"model": "not-served", "prompt": "x"}),
    ("POST", "/tokenize", {"model": M, "prompt": "Hello world"}),
    ("POST", "/tokenize", {"prompt": "no model", "return_token_strs": True}),
    ("POST", "/tokenize", {"model": M, "messages": [{"role": "user", "content": "hi"}],
                           "add_generation_prompt": True}),
    ("POST", "/tokenize", {"model": M, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": IMAGE}}]}]}),
    ("POST", "/detokenize", {"model": M, "tokens": [9707, 1879]}),
    *[("POST", path, {"model": M, "input": "x", "text_1": "a", "text_2": "b", "query": "q", "documents": ["d"]})
      for path in POOLING],
    ("GET", "/version", None),
    ("GET", "/load", None),
    ("GET", "/ping", None),
    ("POST", "/ping", None),
    ("GET", "/v1/models", None),
]

BAD: list[tuple[str, bytes]] = [
    *[(path, raw) for path in ("/v1/completions", "/tokenize", "/detokenize", *POOLING)
      for raw in (b"not json", b"[]", b'{"model": 5}', b'{"model": ""}', b"{" * 5000)],
    ("/v1/completions", orjson.dumps({"model": M})),
    ("/v1/completions", orjson.dumps({"model": M, "prompt": 5})),
    ("/v1/completions", orjson.dumps({"model": M, "prompt": "x", "max_tokens": "many"})),
    ("/v1/completions", orjson.dumps({"model": M, "prompt": "x", "temperature": -3})),
    ("/v1/completions", orjson.dumps({"model": M, "prompt_embeds": "AAAA"})),
    ("/tokenize", orjson.dumps({"model": M})),
    ("/tokenize", orjson.dumps({"model": M, "messages": "hi"})),
    ("/tokenize", orjson.dumps({"model": M, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://10.0.0.1/a.png"}}]}]})),
    ("/tokenize", orjson.dumps({"model": M, "messages": [{"role": "user", "content": [
        {"type": "image_url", "uuid": "a-reference"}]}]})),
    ("/detokenize", orjson.dumps({"model": M, "tokens": [-1]})),
    ("/detokenize", orjson.dumps({"model": M, "tokens": "abc"})),
    ("/v1/embeddings", orjson.dumps({"model": M, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}]})),
]


def normalised(value: Any) -> Any:
    """``value`` with what differs between two answers of one engine (ids, timestamps) blanked."""
    if isinstance(value, dict):
        return {k: "*" if k in ("id", "created", "request_id") else normalised(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalised(v) for v in value]
    return value


def stream_canonical(events: list[Any]) -> Any:
    """A streamed answer as what it says, not how vLLM chunked it: vLLM coalesces the tokens of a
    stream whose reader lags into one chunk (its output collector), so chunk boundaries depend on
    timing. Each choice's text joined, and the chunks with their text blanked, repeats collapsed."""
    texts: dict[int, str] = {}
    shapes: list[Any] = []
    for event in events:
        if isinstance(event, dict):
            event = normalised(event)
            for choice in event.get("choices") or []:
                delta = choice.get("delta") or {}
                for holder, key in ((choice, "text"), (delta, "content")):
                    if isinstance(holder.get(key), str):
                        texts[choice.get("index", 0)] = texts.get(choice.get("index", 0), "") + holder[key]
                        holder[key] = "*"
        if not shapes or shapes[-1] != event:
            shapes.append(event)
    return texts, shapes


async def send(base: str, method: str, path: str, body: Any = None, raw: bytes | None = None,
               headers: dict[str, str] | None = None) -> tuple[int, Any, dict[str, str]]:
    data = raw if raw is not None else (orjson.dumps(body) if body is not None else None)
    sent = {"Content-Type": "application/json"} if data is not None else {}
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http, http.request(
        method, base + path, data=data, headers={**sent, **(headers or {})}
    ) as resp:
        payload = await resp.read()
        if resp.content_type == "text/event-stream":
            events = [line[6:] for line in payload.decode().splitlines() if line.startswith("data: ")]
            decoded: Any = [e if e == "[DONE]" else orjson.loads(e) for e in events]
        else:
            try:
                decoded = orjson.loads(payload) if payload else payload
            except orjson.JSONDecodeError:
                decoded = payload
        return resp.status, decoded, {k.lower(): v for k, v in resp.headers.items()}


def replica_of(headers: dict[str, str], replicas: list[VllmReplica]) -> VllmReplica:
    name = headers.get("x-mmgate-backend", "vllm-0")
    return replicas[int(name.rsplit("-", 1)[1])]


@pytest.mark.parametrize(("method", "path", "body"), CORPUS, ids=[f"{i}-{c[1]}" for i, c in enumerate(CORPUS)])
async def test_direct_and_through_the_gateway_answer_the_same(
    gateway: GatewayProcess, vllm_replicas: list[VllmReplica], method: str, path: str, body: Any
) -> None:
    via_status, via, via_headers = await send(gateway.url, method, path, body)
    replica = replica_of(via_headers, vllm_replicas)
    direct_status, direct, _ = await send(replica.url, method, path, body)
    if path == "/v1/models":
        for card in (*via["data"], *direct["data"]):
            card["permission"] = normalised(card["permission"])
    assert via_status == direct_status, (via, direct)
    if isinstance(body, dict) and body.get("stream") and isinstance(via, list) and isinstance(direct, list):
        assert stream_canonical(via) == stream_canonical(direct)
    else:
        assert normalised(via) == normalised(direct)


async def test_uploads_reach_vllm_and_come_back_unchanged(
    gateway: GatewayProcess, vllm_replicas: list[VllmReplica]
) -> None:
    form = (b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\n' + M.encode() + b"\r\n"
            b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\nContent-Type: audio/wav\r\n\r\n'
            + b"\x00" * 4096 + b"\r\n--b--\r\n")
    for path in ("/v1/audio/transcriptions", "/v1/audio/translations"):
        headers = {"Content-Type": "multipart/form-data; boundary=b"}
        via = await send(gateway.url, "POST", path, raw=form, headers=headers)
        direct = await send(replica_of(via[2], vllm_replicas).url, "POST", path, raw=form, headers=headers)
        assert via[:2] == direct[:2]


@pytest.mark.parametrize(("path", "raw"), BAD, ids=[f"{i}-{b[0]}" for i, b in enumerate(BAD)])
async def test_bad_input_is_a_precise_4xx(gateway: GatewayProcess, path: str, raw: bytes) -> None:
    status, body, _ = await send(gateway.url, "POST", path, raw=raw)
    assert 400 <= status < 500, (status, body)
    assert isinstance(body, dict) and ("error" in body or "detail" in body), body
