"""At ``--max-connections``, with every connection inside a request, each new client gets its 503
(+ ``Retry-After``) and no connection is reset: driven over raw loopback sockets against a real
``mmgate serve`` process, the new clients arriving in one burst, as a load spike does."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from tests.api.test_edge import CHAT
from tests.support.serve_process import serve_process

CAP = 20
# A request whose body is still coming: the connection is inside a request as long as it is open.
IN_A_REQUEST = CHAT + b"Content-Length: 100\r\n\r\n{"


async def answer_of(reader: asyncio.StreamReader) -> bytes:
    """Everything the gateway sends until it closes (b"" when nothing came); a reset is raised."""
    async with asyncio.timeout(10):
        return await reader.read()


async def open_in_a_request(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(IN_A_REQUEST)
    await writer.drain()
    return reader, writer


@pytest.mark.parametrize("door", [[], ["--no-front-door"]], ids=["front-door", "in-process"])
async def test_every_client_over_the_cap_gets_its_503(tmp_path: Path, door: list[str]) -> None:
    with serve_process(tmp_path, "--max-connections", str(CAP), "--header-timeout", "30",
                       "--body-timeout", "30", "--drain-timeout", "1", *door) as gw:
        inside = []
        for _ in range(CAP):  # the cap, every one inside a request (its body pending)
            inside.append(await open_in_a_request(gw.port))
            await asyncio.sleep(0.02)  # each read by the gateway before the next comes
        await asyncio.sleep(0.5)
        for _round in range(3):  # bursts: the new clients arrive together
            over = await asyncio.gather(*(open_in_a_request(gw.port) for _ in range(2 * CAP)))
            answers = await asyncio.gather(*(answer_of(r) for r, _ in over), return_exceptions=True)
            for _, writer in over:
                writer.close()
            resets = [a for a in answers if isinstance(a, BaseException)]
            assert not resets, f"{len(resets)} of {len(answers)} over-cap clients were reset: {resets[:3]}"
            assert all(isinstance(a, bytes) and a.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in a
                       for a in answers), answers
        # None of the connections inside a request was displaced: each still gets its answer.
        for reader, writer in inside:
            writer.write(b"}" * 99)
            await writer.drain()
            async with asyncio.timeout(10):
                head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 400 "), head  # "{}}}…" is no JSON: the gateway's answer
            with contextlib.suppress(OSError):
                writer.close()
