"""A reload that would open the door (authentication turned off, a config file cut to nothing)
or lock it (an API keys file with no key) is refused: a real ``mmgate serve`` process in front of
a real sim engine, its files rewritten and SIGHUP sent while a client keeps sending requests, none
of which may fail. Starting without API keys is allowed, and said in a WARNING."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path

import aiohttp
import pytest

from mmgate._settings import ConfigError
from mmgate.config import BackendSpec
from mmgate.serve.secrets import read_backend_keys
from tests.support.gateway import running_sims
from tests.support.http import CHAT_PATH
from tests.support.serve_process import GatewayProcess, serve_process

BODY = {"model": "mmgate-sim-vl", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


async def status_of(session: aiohttp.ClientSession, url: str, key: str | None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with session.post(url + CHAT_PATH, json=BODY, headers=headers) as r:
        await r.read()
        return r.status


async def steady_client(session: aiohttp.ClientSession, url: str, key: str, statuses: list[int],
                        stop: asyncio.Event) -> None:
    """A tenant that keeps its requests coming through every reload."""
    while not stop.is_set():
        statuses.append(await status_of(session, url, key))


async def logged(gw: GatewayProcess, text: str, count: int) -> list[str]:
    """The gateway's log lines holding ``text``, once there are ``count`` of them (bounded wait)."""
    for _ in range(200):
        lines = [line for line in gw.log(tail=None).splitlines() if text in line]
        if len(lines) >= count:
            return lines
        await asyncio.sleep(0.05)
    raise AssertionError(f"{count} lines with {text!r} never came: {gw.log()}")


async def refused(gw: GatewayProcess, count: int, names: str) -> None:
    """SIGHUP, and the ``count``-th reload is refused with an ERROR line naming ``names``."""
    gw.proc.send_signal(signal.SIGHUP)
    errors = await logged(gw, " ERROR mmgate.serve.reload: reload refused, the old settings stay", count)
    assert len(errors) == count and names in errors[-1], errors
    assert not [line for line in gw.log(tail=None).splitlines() if "reloaded:" in line]


async def test_a_reload_that_would_open_or_lock_the_door_keeps_the_old_settings(tmp_path: Path) -> None:
    async with running_sims(1) as sims:
        keys = tmp_path / "keys.txt"
        keys.write_text("key-a tenant-a\n")
        config = tmp_path / "mmgate.toml"
        good = f"api-keys-file = '{keys}'\n"  # the backend comes from a flag
        config.write_text(good)
        with serve_process(tmp_path, "--config", str(config), "--backend", f"vllm={sims[0].url}",
                           "--access-log", "off") as gw:
            assert "authentication is off" not in gw.log(tail=None)
            async with aiohttp.ClientSession() as session:
                statuses: list[int] = []
                stop = asyncio.Event()
                client = asyncio.create_task(steady_client(session, gw.url, "key-a", statuses, stop))
                try:
                    config.write_text("")  # cut to nothing: read as "no keys file", the door would open
                    await refused(gw, 1, str(config))
                    assert await status_of(session, gw.url, None) == 401
                    config.write_text(good)
                    keys.write_text("")  # no key: every tenant would get 401
                    await refused(gw, 2, str(keys))
                    keys.write_text('{"key-a": "ten')  # cut short: unparseable
                    await refused(gw, 3, str(keys))
                    keys.unlink()  # unreadable
                    await refused(gw, 4, str(keys))
                    keys.write_text("key-a tenant-a\n")
                    config.write_text("access-log = 'off'\n")  # authentication off: a restart's job
                    await refused(gw, 5, "turning authentication off needs a restart")
                    assert await status_of(session, gw.url, None) == 401
                    assert await status_of(session, gw.url, "key-a") == 200
                    # A good reload still applies.
                    keys.write_text("key-a tenant-a\nkey-b tenant-b\n")
                    config.write_text(good)
                    gw.proc.send_signal(signal.SIGHUP)
                    await logged(gw, "reloaded:", 1)
                    assert await status_of(session, gw.url, "key-b") == 200
                finally:
                    stop.set()
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.wait_for(client, 30)
                assert len(statuses) > 10 and set(statuses) == {200}, statuses  # no request failed


def test_starting_without_api_keys_warns_and_an_empty_keys_file_fails(tmp_path: Path) -> None:
    with serve_process(tmp_path) as gw:
        warnings = [line for line in gw.log(tail=None).splitlines() if " WARNING " in line]
        assert any("no --api-keys-file: authentication is off" in line for line in warnings), gw.log()
    keys = tmp_path / "keys.txt"
    keys.write_text("# every key was cut\n")
    with pytest.raises(RuntimeError, match="holds no API key"), serve_process(tmp_path, "--api-keys-file", str(keys)):
        pass


def test_a_config_file_or_backend_keys_file_with_nothing_in_it_is_refused(tmp_path: Path) -> None:
    backend_keys = tmp_path / "backend-keys"
    backend_keys.write_text("\n# cut\n")
    with pytest.raises(ConfigError, match=f"{backend_keys} holds no backend key"):
        read_backend_keys(str(backend_keys), [BackendSpec(kind="vllm", url="http://10.0.0.1:8000")])
    config = tmp_path / "mmgate.toml"
    config.write_text("# every setting was cut\n")
    with pytest.raises(RuntimeError, match=f"{config} holds no setting"), serve_process(tmp_path, "--config",
                                                                                         str(config)):
        pass
