"""The HTTP side of the benchmark: one aiohttp session, a large keep-alive pool, SSE parsing.

Timing follows AIPerf's definitions: a request starts just before it is handed to aiohttp; TTFT
is the arrival of the first SSE chunk with non-empty ``content`` (or ``reasoning_content``); the
request ends with the last chunk received. Output tokens come from the server's ``usage``
(``stream_options.include_usage``), else one per content chunk. aiohttp errors are translated
here into a failed ``ResponseResult``; they never escape this module.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp
import orjson

from mmgate.bench.apis import API_PATHS, whole_reply
from mmgate.bench.errors import BenchError
from mmgate.bench.streams import STREAM_PARSERS, SSEState
from mmgate.vllm_protocol import cache_miss_index, error_message

__all__ = ["ChatClient", "ResponseResult", "SSEState", "endpoint_urls"]

_ERROR_BODY_LIMIT = 64 * 1024


@dataclass(slots=True)
class ResponseResult:
    """Outcome and timestamps (``time.perf_counter_ns``) of one request."""

    status: int
    error: str | None
    start_ns: int
    first_token_ns: int
    end_ns: int
    output_tokens: int
    content_chunks: int
    text: str | None = None
    cache_miss: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


def endpoint_urls(url: str, chat_path: str = "/v1/chat/completions") -> tuple[str, str]:
    """(chat URL, models URL) from ``--url``, given with or without a trailing ``/v1``."""
    base = url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    if not base.startswith(("http://", "https://")):
        raise BenchError(f"--url must start with http:// or https://, got {url!r}")
    return base + chat_path, base + "/v1/models"


def _error_message(raw: bytes) -> str:
    fallback = raw[:300].decode("utf-8", "replace").strip()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return fallback
    return error_message(body, fallback)


class ChatClient:
    """Sends requests of one API (``mmgate.bench.apis``: chat, responses, messages) to one endpoint.
    Use as an async context manager."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        session_header: str | None = "x-session-id",
        request_timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        max_connections: int = 4096,
        chat_path: str | None = None,
        api: str = "chat",
    ) -> None:
        self.api = api
        self.chat_url, self.models_url = endpoint_urls(url, chat_path or API_PATHS[api])
        default_headers = {"Content-Type": "application/json"}
        if api_key:
            default_headers["Authorization"] = f"Bearer {api_key}"
        default_headers.update(headers or {})
        self._default_headers = default_headers
        self._session_header = session_header
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout_s, sock_read=request_timeout_s
        )
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self.model_owners: dict[str, str] = {}  # model id → owned_by, from the last list_models

    async def __aenter__(self) -> ChatClient:
        connector = aiohttp.TCPConnector(
            limit=self._max_connections, limit_per_host=0, keepalive_timeout=60, ttl_dns_cache=300
        )
        self._session = aiohttp.ClientSession(
            connector=connector, headers=self._default_headers, timeout=self._timeout
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("ChatClient used outside 'async with'")
        return self._session

    async def list_models(self) -> list[str]:
        """Model ids from ``GET /v1/models``; ``BenchError`` when the endpoint cannot say."""
        try:
            async with self.session.get(self.models_url) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise BenchError(
                        f"GET {self.models_url} answered {resp.status}: {_error_message(raw)}; "
                        "give --model"
                    )
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise BenchError(f"cannot reach {self.models_url}: {exc or type(exc).__name__}") from exc
        try:
            data = orjson.loads(raw).get("data") or []
            cards = [m for m in data if isinstance(m, dict) and "id" in m]
            self.model_owners = {str(m["id"]): str(m.get("owned_by") or "") for m in cards}
            return [str(m["id"]) for m in cards]
        except (orjson.JSONDecodeError, AttributeError, TypeError) as exc:
            raise BenchError(f"GET {self.models_url} did not return a model list; give --model") from exc

    async def chat(
        self, body: bytes, *, session_id: str | None, stream: bool, collect_text: bool = False
    ) -> ResponseResult:
        """Send one request; every failure becomes a result with ``error`` set."""
        headers = {self._session_header: session_id} if session_id and self._session_header else None
        start = time.perf_counter_ns()
        result = ResponseResult(0, None, start, -1, start, 0, 0)
        try:
            async with self.session.post(self.chat_url, data=body, headers=headers) as resp:
                result.status = resp.status
                if resp.status >= 300:
                    raw = b""  # up to the limit, over as many chunks as it comes in
                    while len(raw) < _ERROR_BODY_LIMIT and (chunk := await resp.content.read(_ERROR_BODY_LIMIT - len(raw))):
                        raw += chunk
                    message = _error_message(raw)
                    result.error = f"HTTP {resp.status}: {message}"
                    result.cache_miss = cache_miss_index(resp.status, {"message": message}) is not None
                elif stream:
                    await self._read_stream(resp, result, collect_text, self.api)
                else:
                    await self._read_whole(resp, result, collect_text, self.api)
        except asyncio.CancelledError:
            raise
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            # Transport trouble is the server's (or network's) failure: count it, go on.
            result.error = f"{type(exc).__name__}: {exc}"[:300] if str(exc) else type(exc).__name__
        result.end_ns = time.perf_counter_ns() if result.error else result.end_ns
        return result

    @staticmethod
    async def _read_whole(resp: aiohttp.ClientResponse, result: ResponseResult, collect: bool, api: str) -> None:
        raw = await resp.read()
        result.end_ns = time.perf_counter_ns()
        try:
            text, tokens = whole_reply(api, orjson.loads(raw))
        except (orjson.JSONDecodeError, ValueError, KeyError, IndexError, TypeError, AttributeError):
            result.error = f"malformed {api} reply: " + raw[:200].decode("utf-8", "replace")
            return
        result.output_tokens = tokens if tokens is not None else len(text.split())
        result.content_chunks = 1 if text else 0
        if collect:
            result.text = text

    @staticmethod
    async def _read_stream(resp: aiohttp.ClientResponse, result: ResponseResult, collect: bool, api: str) -> None:
        state = STREAM_PARSERS[api](collect)
        # Read to EOF even after [DONE]: leaving the body unread would close the keep-alive connection.
        async for chunk in resp.content.iter_any():
            if state.done:
                continue
            now = time.perf_counter_ns()
            result.end_ns = now
            state.feed(chunk, now)
        if state.tail:
            state.feed(b"\n", result.end_ns)  # an event not followed by a newline
        result.first_token_ns = state.first_token_ns
        result.content_chunks = state.content_chunks
        result.error = state.error
        result.output_tokens = state.usage_tokens if state.usage_tokens is not None else state.content_chunks
        if collect:
            result.text = "".join(state.pieces)
