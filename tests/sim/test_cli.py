"""``mmgate sim`` on the command line: --help, settings from flags and env, a real process."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from mmgate._settings import ConfigError
from mmgate.cli import build_parser
from mmgate.sim.cli import settings_from_args

MMGATE = Path(sys.executable).with_name("mmgate")


def test_help_describes_a_vllm_stand_in() -> None:
    out = subprocess.run([str(MMGATE), "sim", "--help"], capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert "stand-in for vLLM" in out.stdout
    for flag in ("--host", "--port", "--model", "--mm-processor-cache-gb", "--speedup"):
        assert flag in out.stdout


def test_settings_from_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MMGATE_MODEL", "from-env")
    args = build_parser().parse_args(["sim", "--port", "0", "--mm-processor-cache-gb", "0.5",
                                      "--speedup", "100", "--no-decode-on-hit"])
    settings = settings_from_args(args)
    assert settings.model == "from-env"
    assert (settings.port, settings.mm_processor_cache_gb, settings.speedup) == (0, 0.5, 100.0)
    assert settings.decode_on_hit is False
    bad = build_parser().parse_args(["sim", "--speedup", "0"])
    with pytest.raises(ConfigError) as info:
        settings_from_args(bad)
    assert info.value.setting == "--speedup"


async def test_process_serves_until_sigterm() -> None:
    env = {**os.environ, "MMGATE_SPEEDUP": "1000"}
    proc = await asyncio.create_subprocess_exec(
        str(MMGATE), "sim", "--host", "127.0.0.1", "--port", "0", "--model", "cli-model",
        stderr=asyncio.subprocess.PIPE, env=env,
    )
    try:
        assert proc.stderr is not None
        line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
        match = re.search(r"http://127\.0\.0\.1:\d+", line)
        assert match, line
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{match.group(0)}/health") as resp:
                assert resp.status == 200
            body = {"model": "cli-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            async with http.post(f"{match.group(0)}/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                assert (await resp.json())["usage"]["completion_tokens"] == 2
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_a_taken_port_is_one_line_not_a_traceback() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([str(MMGATE), "sim", "--port", str(port)], capture_output=True, text=True,
                             timeout=60, check=False)
    assert out.returncode == 1, out.stderr
    assert f"mmgate sim: cannot listen on 127.0.0.1:{port}" in out.stderr
    assert "Traceback" not in out.stderr
