"""``HTTPBackend.request``: any method and path, whole and streamed bodies both ways, the
backend's own key replacing a client's, error statuses read whole, failures translated."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest

from mmgate.backends import HTTPBackend
from mmgate.errors import BackendConnectError
from mmgate.wire import free_port
from tests.backends.echo_server import echo_backend


def make(url: str, **kw: object) -> HTTPBackend:
    options: dict[str, object] = {"connect_timeout_s": 1.0, "read_timeout_s": 5.0, **kw}
    return HTTPBackend("b", "vllm", url, **options)  # type: ignore[arg-type]


async def test_any_method_path_and_query_with_the_backends_key() -> None:
    async with echo_backend() as echo:
        b = make(echo.url, api_key="backend-key")
        reply = await b.request("POST", "/tokenize?x=1", body=b'{"prompt":"hi"}',
                                headers={"Content-Type": "application/json", "authorization": "Bearer client"})
        assert reply.status == 200 and reply.stream is None
        answer = orjson.loads(reply.body or b"")
        assert answer["method"] == "POST" and answer["path"] == "/tokenize?x=1" and answer["bytes"] == 15
        assert answer["authorization"] == "Bearer backend-key"  # the client's key never reaches it
        reply = await b.request("GET", "/version")
        assert orjson.loads(reply.body or b"")["method"] == "GET"
        await b.close()


async def test_without_a_backend_key_the_callers_authorization_passes() -> None:
    async with echo_backend() as echo:
        b = make(echo.url)
        reply = await b.request("POST", "/x", body=b"{}", headers={"Authorization": "Bearer fwd"})
        assert orjson.loads(reply.body or b"")["authorization"] == "Bearer fwd"
        await b.close()


async def test_streamed_upload_and_streamed_reply() -> None:
    async def upload() -> AsyncIterator[bytes]:
        for _ in range(8):
            yield b"x" * 100_000

    async with echo_backend() as echo:
        b = make(echo.url)
        reply = await b.request("POST", "/v1/audio/transcriptions", body=upload(),
                                headers={"Content-Type": "multipart/form-data; boundary=z"})
        assert orjson.loads(reply.body or b"")["bytes"] == 800_000
        reply = await b.request("POST", "/v1/completions?sse=3", body=b"{}", stream=True)
        assert reply.stream is not None
        data = b"".join([c async for c in reply.stream])
        reply.release()
        assert data.count(b"data: ") == 4 and data.endswith(b"data: [DONE]\n\n")
        # Asked not to stream: the event stream comes back whole.
        reply = await b.request("POST", "/v1/completions?sse=2", body=b"{}", stream=False)
        assert reply.stream is None and (reply.body or b"").count(b"data: ") == 3
        await b.close()


async def test_error_status_is_whole_and_unreachable_is_connect_error() -> None:
    async with echo_backend() as echo:
        b = make(echo.url)
        reply = await b.request("POST", "/score?status=422", body=b"{}", stream=True)
        assert reply.status == 422 and reply.stream is None
        assert orjson.loads(reply.body or b"")["error"]["code"] == 422
        await b.close()
    b = make(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(BackendConnectError):
        await b.request("GET", "/version")
    await b.close()
