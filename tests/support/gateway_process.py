"""``mmgate serve`` as a real separate process on loopback, for tests that need several gateways
with nothing shared (each its own interpreter, hash seed and memory)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import aiohttp

from tests.support.ports import free_port


@asynccontextmanager
async def gateway_process(
    backend_urls: Sequence[str], *args: str, hash_seed: int = 0, timeout_s: float = 30.0
) -> AsyncIterator[str]:
    """A gateway process routing to ``backend_urls`` (kind vllm); yields its base URL once
    ``/health`` answers 200. ``hash_seed`` sets PYTHONHASHSEED, so processes differ where Python's
    ``hash()`` would."""
    port = free_port()
    backends = [a for url in backend_urls for a in ("--backend", f"vllm={url}")]
    env = {**os.environ, "PYTHONHASHSEED": str(hash_seed)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "mmgate", "serve", "--host", "127.0.0.1", "--port", str(port),
        "--log-level", "warning", *backends, *args,
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as client, asyncio.timeout(timeout_s):
            while True:
                if proc.returncode is not None:
                    err = await proc.stderr.read() if proc.stderr else b""
                    raise RuntimeError(f"mmgate serve exited: {err.decode()[-2000:]}")
                try:
                    async with client.get(url + "/health") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)
        yield url
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                async with asyncio.timeout(10):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
