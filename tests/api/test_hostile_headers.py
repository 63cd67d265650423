"""Header bytes no client library would send, over a raw socket to a real gateway: non-UTF-8 and
control bytes in the session header and in Authorization get a 400/401 in OpenAI's shape, never
aiohttp's plain-text 500."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from tests.support.gateway import gateway_settings, running_gateway

BODY = orjson.dumps({"model": "mmgate-sim-vl", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})


async def raw_post(port: int, headers: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + headers + b"Content-Length: " + str(len(BODY)).encode() + b"\r\nConnection: close\r\n\r\n" + BODY)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


@pytest.mark.parametrize("value", [b"\xff\xfe", b"caf\xc3\xa9\xff", b"\xed\xa0\x80", b"\xc2\x85"])
async def test_undecodable_session_header_is_a_400(value: bytes) -> None:
    async with running_gateway() as gw:
        status, body = await raw_post(gw.port, b"x-session-id: " + value + b"\r\n")
        assert status == 400, body
        err = orjson.loads(body)["error"]
        assert err["param"] == "x-session-id" and err["type"] == "invalid_request_error"
        assert (await raw_post(gw.port, b"x-session-id: fine\r\n"))[0] == 200
        # Control bytes never reach the gateway: aiohttp's own parser answers 400 (plain text).
        assert (await raw_post(gw.port, b"x-session-id: a\x01b\r\n"))[0] == 400


@pytest.mark.parametrize("value", [b"Bearer \xff\xfe", b"Bearer k\xc3\xa9y", b"\xff"])
async def test_undecodable_authorization_is_a_401(tmp_path: Path, value: bytes) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("key-a tenant-a\n")
    async with running_gateway(gateway_settings(api_keys_file=str(keys))) as gw:
        status, body = await raw_post(gw.port, b"Authorization: " + value + b"\r\n")
        assert status == 401, body
        assert orjson.loads(body)["error"]["type"] == "authentication_error"
        assert (await raw_post(gw.port, b"Authorization: Bearer key-a\r\n"))[0] == 200
