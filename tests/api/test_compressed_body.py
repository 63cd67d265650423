"""Compressed request bodies, through a real ``mmgate serve``: refused (415) by default; with
``--max-inflation-ratio`` inflated in a lowest-priority thread under both the ratio and the body cap; a gzip bomb
(a few hundred KB inflating to 256 MiB) is refused without the gateway's memory following it."""

from __future__ import annotations

import contextlib
import gzip
import zlib
from pathlib import Path

import aiohttp
import orjson
import pytest

from mmgate.api.edge import MAX_GZIP_MEMBERS
from tests.support.gateway import gateway_settings, running_gateway
from tests.support.serve_process import GatewayProcess, serve_process

MiB = 1024 * 1024
CHAT = orjson.dumps({"model": "mmgate-sim-vl", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """256 MiB of zeros, gzip-compressed (~250 KB)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(MiB)
    return b"".join(packer.compress(zeros) for _ in range(256)) + packer.flush()


def rss_mib(gw: GatewayProcess) -> float:
    for line in Path(f"/proc/{gw.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def post(gw: GatewayProcess, body: bytes, encoding: str | None) -> tuple[int, dict[str, object]]:
    headers = {"Content-Type": "application/json"}
    if encoding:
        headers["Content-Encoding"] = encoding
    async with aiohttp.ClientSession() as s, s.post(gw.url + "/v1/chat/completions", data=body,
                                                    headers=headers) as r:
        return r.status, await r.json(content_type=None)


async def test_compressed_bodies_are_refused_by_default(tmp_path: Path, bomb: bytes) -> None:
    with serve_process(tmp_path) as gw:
        status, answer = await post(gw, gzip.compress(CHAT), "gzip")
        assert status == 415, answer
        error = answer["error"]
        assert isinstance(error, dict) and error["param"] == "Content-Encoding"
        assert error["code"] == "unsupported_content_encoding"
        before = rss_mib(gw)
        for _ in range(3):
            status, _ = await post(gw, bomb, "gzip")
            assert status == 415
        assert rss_mib(gw) - before < 100  # nothing was inflated
        assert (await post(gw, CHAT, None))[0] == 200
        assert (await post(gw, CHAT, "identity"))[0] == 200


def lowest_priority_threads(gw: GatewayProcess) -> int:
    """The gateway's threads at nice 19 (field 19 of /proc/PID/task/TID/stat)."""
    count = 0
    for stat in Path(f"/proc/{gw.proc.pid}/task").glob("*/stat"):
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            if int(stat.read_text().rsplit(")", 1)[1].split()[16]) == 19:
                count += 1
    return count


async def test_allowed_bodies_inflate_under_the_ratio_and_the_cap(tmp_path: Path, bomb: bytes) -> None:
    with serve_process(tmp_path, "--max-inflation-ratio", "20", "--max-body-bytes", str(64 * MiB)) as gw:
        assert lowest_priority_threads(gw) == 0
        assert (await post(gw, gzip.compress(CHAT), "gzip"))[0] == 200
        # Inflating is a cost the client chooses: it runs in the gateway's lowest-priority threads.
        assert lowest_priority_threads(gw) >= 1
        assert (await post(gw, zlib.compress(CHAT), "deflate"))[0] == 200
        before = rss_mib(gw)
        for _ in range(3):
            status, answer = await post(gw, bomb, "gzip")
            assert status == 413, answer
            error = answer["error"]
            assert isinstance(error, dict) and "--max-inflation-ratio" in str(error["message"])
        assert rss_mib(gw) - before < 100
        status, answer = await post(gw, b"\x1f\x8b not gzip at all", "gzip")
        assert status == 400 and isinstance(answer["error"], dict) and answer["error"]["param"] == "Content-Encoding"
        assert (await post(gw, gzip.compress(CHAT)[:-12], "gzip"))[0] == 400  # truncated
        assert (await post(gw, gzip.compress(CHAT), "br"))[0] == 415


async def test_every_gzip_member_is_inflated_and_trailing_bytes_refused() -> None:
    """A gzip body may be several members (RFC 1952): all are the body, none is dropped; bytes after
    the compressed data are a 400, not silently cut off; so are more than ``MAX_GZIP_MEMBERS``."""
    half = len(CHAT) // 2
    members = gzip.compress(CHAT[:half]) + gzip.compress(CHAT[half:])
    async with running_gateway(gateway_settings(max_inflation_ratio=20)) as gw, aiohttp.ClientSession() as s:
        for body, encoding, status in ((members, "gzip", 200), (gzip.compress(CHAT) + b"junk", "gzip", 400),
                                       (zlib.compress(CHAT) + b"junk", "deflate", 400),
                                       (gzip.compress(CHAT) + gzip.compress(b" "), "gzip", 200),
                                       (gzip.compress(CHAT) + gzip.compress(b"") * MAX_GZIP_MEMBERS, "gzip", 400)):
            headers = {"Content-Type": "application/json", "Content-Encoding": encoding}
            async with s.post(gw.url + "/v1/chat/completions", data=body, headers=headers) as r:
                answer = await r.json(content_type=None)
                assert r.status == status, (body[-8:], answer)
                if status == 400:
                    assert answer["error"]["param"] == "Content-Encoding", answer
