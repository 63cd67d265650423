"""A zero-latency OpenAI-compatible endpoint for measuring the benchmark client itself.

A bare asyncio protocol (uvloop when installed) that answers ``POST /v1/chat/completions`` at once
— streaming: ``--tokens`` SSE content chunks, a usage chunk and ``[DONE]`` in one write; not
streaming: one JSON completion — and ``GET /v1/models``. HTTP/1.1 keep-alive, Content-Length
bodies only. It does no work, so whatever latency a client measures against it is the client's
(and the loopback's). Run it in its own process so it does not share the client's CPU:

    python benchmarks/servers/zero_latency_server.py --port 8799 --tokens 8
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from typing import cast

MODELS = b'{"object":"list","data":[{"id":"zero","object":"model","owned_by":"bench"}]}'


def build_responses(tokens: int) -> tuple[bytes, bytes]:
    """(streaming body, non-streaming body), built once."""
    chunks = [
        b'data: {"id":"z","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    ]
    for i in range(tokens):
        chunks.append(
            b'data: {"id":"z","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"t%d "}}]}\n\n'
            % i
        )
    chunks.append(
        b'data: {"id":"z","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":1,'
        b'"completion_tokens":%d,"total_tokens":%d}}\n\n' % (tokens, tokens + 1)
    )
    chunks.append(b"data: [DONE]\n\n")
    text = b" ".join(b"t%d" % i for i in range(tokens))
    whole = (
        b'{"id":"z","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"'
        + text
        + b'"},"finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":%d,"total_tokens":%d}}'
        % (tokens, tokens + 1)
    )
    return b"".join(chunks), whole


def http_response(body: bytes, content_type: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: " + content_type + b"\r\nContent-Length: %d\r\n"
        b"Connection: keep-alive\r\n\r\n" % len(body) + body
    )


class ZeroLatencyProtocol(asyncio.Protocol):
    """Parses pipelined HTTP/1.1 requests with Content-Length and answers each at once."""

    def __init__(self, stream_reply: bytes, whole_reply: bytes, models_reply: bytes) -> None:
        self._stream = stream_reply
        self._whole = whole_reply
        self._models = models_reply
        self._buffer = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        out = []
        while True:
            head_end = self._buffer.find(b"\r\n\r\n")
            if head_end < 0:
                break
            head = self._buffer[:head_end]
            length = 0
            lower = head.lower()
            pos = lower.find(b"content-length:")
            if pos >= 0:
                line_end = lower.find(b"\r\n", pos)
                length = int(lower[pos + 15 : line_end if line_end >= 0 else len(lower)].strip())
            total = head_end + 4 + length
            if len(self._buffer) < total:
                break
            body = self._buffer[head_end + 4 : total]
            self._buffer = self._buffer[total:]
            if head.startswith(b"GET /v1/models"):
                out.append(self._models)
            elif b'"stream":false' in body or b'"stream": false' in body:
                out.append(self._whole)
            else:
                out.append(self._stream)
        if out and self._transport is not None:
            self._transport.write(b"".join(out))


async def serve(host: str, port: int, tokens: int) -> None:
    stream_body, whole_body = build_responses(tokens)
    replies = (
        http_response(stream_body, b"text/event-stream"),
        http_response(whole_body, b"application/json"),
        http_response(MODELS, b"application/json"),
    )
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: ZeroLatencyProtocol(*replies), host, port, backlog=4096)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    print(f"zero-latency endpoint on http://{host}:{port} ({tokens} tokens per reply)", flush=True)
    async with server:
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8799)
    parser.add_argument("--tokens", type=int, default=8)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # the default loop only makes the server slower
        pass
    asyncio.run(serve(args.host, args.port, args.tokens))


if __name__ == "__main__":
    main()
