"""Operator endpoints behind the admin key, and multipart audio uploads streamed through under
the body cap and deadline. Real gateway, echo backends (``tests.backends.echo_server``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from mmgate.api.admin import OPERATOR_ENDPOINTS
from mmgate.config import BackendSpec
from mmgate.errors import ConfigError
from mmgate.serve.secrets import read_admin_key, read_backend_keys
from tests.api.test_endpoints import call, fleet

ADMIN = "operator-key-0123456789"


async def test_operator_endpoints_are_refused_without_an_admin_key() -> None:
    async with fleet() as (gw, backends):
        for method, path in OPERATOR_ENDPOINTS:
            status, body, _, _ = await call(method, gw.url + path, body={} if method == "POST" else None,
                                            headers={"X-Mmgate-Admin-Key": ADMIN})
            assert status == 403 and body["error"]["code"] == "admin_key_required", (path, body)
            assert "--admin-key-file" in body["error"]["message"]
        assert not any(b.seen for b in backends)


async def test_the_admin_key_opens_them_for_one_backend_or_all(tmp_path: Path) -> None:
    key_file = tmp_path / "admin"
    key_file.write_text(ADMIN + "\n")
    async with fleet(admin_key_file=str(key_file)) as (gw, backends):
        for headers in ({}, {"X-Mmgate-Admin-Key": "wrong-key-0123456789"}):
            status, body, _, _ = await call("POST", gw.url + "/sleep?level=1", body={}, headers=headers)
            assert status == 403 and body["error"]["param"] == "X-Mmgate-Admin-Key"
        status, body, headers, _ = await call("POST", gw.url + "/sleep?level=1", raw=b"",
                                              headers={"X-Mmgate-Admin-Key": ADMIN, "X-Mmgate-Backend": "e1"})
        assert status == 200 and body["backend"] == "e1" and body["path"] == "/sleep?level=1"
        assert headers["x-mmgate-backend"] == "e1"
        # As a vLLM client sends its key; the key goes no further than the gateway.
        status, body, _, _ = await call("POST", gw.url + "/sleep?level=1", raw=b"",
                                        headers={"Authorization": f"Bearer {ADMIN}", "X-Mmgate-Backend": "e0"})
        assert status == 200 and body["backend"] == "e0" and body["authorization"] is None
        status, body, _, _ = await call("GET", gw.url + "/is_sleeping", headers={"X-Mmgate-Admin-Key": ADMIN})
        assert status == 200 and [b["backend"] for b in body["backends"]] == ["e0", "e1"]
        assert all(b["status"] == 200 and b["body"]["method"] == "GET" for b in body["backends"])
        status, body, _, _ = await call("POST", gw.url + "/v1/load_lora_adapter?status=400",
                                        body={"lora_name": "a", "lora_path": "/x"},
                                        headers={"X-Mmgate-Admin-Key": ADMIN})
        assert status == 502 and {b["status"] for b in body["backends"]} == {400}
        status, body, _, _ = await call("POST", gw.url + "/wake_up", body={},
                                        headers={"X-Mmgate-Admin-Key": ADMIN, "X-Mmgate-Backend": "nobody"})
        assert status == 400 and body["error"]["param"] == "X-Mmgate-Backend"
        assert all(s.path_qs != "/wake_up" for b in backends for s in b.seen)


def multipart(model: str | None, audio: bytes) -> tuple[bytes, str]:
    boundary = "mmgate-test-boundary"
    parts = []
    if model is not None:
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\n{model}\r\n'.encode())
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
                 "Content-Type: audio/wav\r\n\r\n".encode() + audio + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


async def test_uploads_are_routed_by_their_model_field_and_streamed() -> None:
    async with fleet((("m1",), ("m2",))) as (gw, backends):
        for model, backend in (("m1", "e0"), ("m2", "e1")):
            data, ctype = multipart(model, b"\x00" * 300_000)
            for path in ("/v1/audio/transcriptions", "/v1/audio/translations"):
                status, body, _, _ = await call("POST", gw.url + path, raw=data, headers={"Content-Type": ctype})
                assert status == 200 and body["backend"] == backend and body["bytes"] == len(data)
                assert body["content_type"] == ctype
        data, ctype = multipart(None, b"\x00" * 10)
        status, body, _, _ = await call("POST", gw.url + "/v1/audio/transcriptions", raw=data,
                                        headers={"Content-Type": ctype})
        assert status == 400 and body["error"]["param"] == "model"
        uploads = [s.body for b in backends for s in b.seen if s.path_qs.startswith("/v1/audio/")]
        assert len(uploads) == 4


async def test_uploads_over_the_cap_or_too_slow_are_cut() -> None:
    async with fleet((("m1",),), max_body_bytes=1_000_000, body_timeout_s=1.0) as (gw, backends):
        data, ctype = multipart("m1", b"\x00" * 2_000_000)
        status, _, _, _ = await call("POST", gw.url + "/v1/audio/transcriptions", raw=data,
                                        headers={"Content-Type": ctype})
        assert status == 413  # declared length: refused before a byte is read

        async def chunked() -> AsyncIterator[bytes]:
            for _ in range(40):
                yield b"\x00" * 100_000

        async with aiohttp.ClientSession() as s, s.post(gw.url + "/v1/audio/translations", data=chunked(),
                                                        headers={"Content-Type": ctype}) as r:
            assert r.status == 413 and (await r.json())["error"]["type"] == "invalid_request_error"

        async def slow() -> AsyncIterator[bytes]:
            yield multipart("m1", b"")[0][:80]
            await asyncio.sleep(3)
            yield b"late"

        async with aiohttp.ClientSession() as s, s.post(gw.url + "/v1/audio/translations", data=slow(),
                                                        headers={"Content-Type": ctype}) as r:
            assert r.status == 408
        assert not [s for b in backends for s in b.seen if s.path_qs.startswith("/v1/audio/")]
        metrics = (await call("GET", gw.url + "/metrics"))[3].decode()
        assert 'route="/v1/audio/translations",status="413"' in metrics
        assert orjson.loads((await call("GET", gw.url + "/load"))[3]) == {"server_load": 0}


def test_key_files_are_checked_at_start(tmp_path: Path) -> None:
    specs = (BackendSpec(kind="vllm", url="http://10.0.0.1:8000"), BackendSpec(kind="openai", url="https://api.x"))
    keys = tmp_path / "keys"
    keys.write_text('{"http://10.0.0.1:8000/": "k0", "openai-1": "k1"}')
    assert read_backend_keys(str(keys), specs) == {"http://10.0.0.1:8000": "k0", "https://api.x": "k1"}
    for text in ("vllm-7 k", "http://10.0.0.1:8000 k extra", "{not json", '{"vllm-0": 5}'):
        keys.write_text(text)
        with pytest.raises(ConfigError) as info:
            read_backend_keys(str(keys), specs)
        assert info.value.setting == "--backend-keys-file"
    admin = tmp_path / "admin"
    admin.write_text("short\n")
    with pytest.raises(ConfigError):
        read_admin_key(str(admin))
    with pytest.raises(ConfigError):
        read_admin_key(str(tmp_path / "missing"))
    admin.write_text(f"  {ADMIN}\n")
    assert read_admin_key(str(admin)) == ADMIN
