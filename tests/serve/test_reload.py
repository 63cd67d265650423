"""SIGHUP reload of a real ``mmgate serve`` process under load: the static backend list, the API keys
and the tenant secret change without a request in flight failing; a bad file keeps every old value,
logged and counted. The engines are real sim servers on loopback."""

from __future__ import annotations

import asyncio
import signal
import urllib.request
from pathlib import Path

import aiohttp
import orjson

from mmgate.sim.config import SimSettings
from tests.support.gateway import running_sims
from tests.support.http import CHAT_PATH
from tests.support.images import png_data_url
from tests.support.serve_process import GatewayProcess, metric_value, serve_process

SLOW_SIM = SimSettings(port=0, speedup=20.0)  # 0.5 ms a token: a streamed answer of 4000 takes ~2 s


def body(seed: int, *, stream: bool = False) -> dict[str, object]:
    # A stream ignores the modelled EOS (8..255 tokens) so that it really lasts its 4000 tokens.
    return {"model": "mmgate-sim-vl", "max_tokens": 4000 if stream else 8, "stream": stream, "ignore_eos": stream,
            "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": png_data_url(seed)}, "uuid": f"img-{seed}"}]}]}


async def chat(session: aiohttp.ClientSession, url: str, key: str, seed: int, *,
               stream: bool = False, answering: asyncio.Event | None = None) -> tuple[int, str]:
    """One request; its status and the backend that answered (streams read to their end).
    ``answering`` is set once the answer has begun."""
    async with session.post(url + CHAT_PATH, json=body(seed, stream=stream),
                            headers={"Authorization": f"Bearer {key}", "x-session-id": f"s{seed}"}) as r:
        if answering is not None:
            answering.set()
        data = await r.read()
        if stream and r.status == 200:
            assert data.rstrip().endswith(b"data: [DONE]"), data[-200:]
        return r.status, r.headers.get("x-mmgate-backend", "")


async def successes(session: aiohttp.ClientSession, engine_url: str) -> float:
    """Requests an engine answered, from its own /metrics."""
    async with session.get(engine_url + "/metrics") as r:
        text = await r.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total{"))


ADMIN_KEY = "admin-key-0123456789abcdef"  # /metrics answers only it once API keys are set


def scrape(gw: GatewayProcess) -> str:
    request = urllib.request.Request(gw.url + "/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    with urllib.request.urlopen(request, timeout=5) as resp:
        return str(resp.read().decode())


async def until_reloaded(gw: GatewayProcess, result: str, count: int) -> None:
    for _ in range(200):
        if metric_value(scrape(gw), "mmgate_reloads_total", result=result) >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no {result} reload: {gw.log()}")


def write_config(path: Path, urls: list[str], keys_file: Path, secret: str) -> None:
    admin = path.with_name("admin-key")
    admin.write_text(ADMIN_KEY)
    path.write_text(f"backend = {orjson.dumps([f'vllm={u}' for u in urls]).decode()}\n"
                    f"api-keys-file = '{keys_file}'\ntenant-secret = '{secret}'\nadmin-key-file = '{admin}'\n")


async def test_sighup_swaps_backends_keys_and_secret_without_dropping_requests(tmp_path: Path) -> None:
    async with running_sims(3, SLOW_SIM) as sims:
        keys = tmp_path / "keys.json"
        keys.write_text('{"old-key": "acme"}')
        config = tmp_path / "mmgate.toml"
        write_config(config, [sims[0].url, sims[1].url], keys, "s" * 16)
        with serve_process(tmp_path, "--config", str(config)) as gw:
            async with aiohttp.ClientSession() as session:
                assert (await chat(session, gw.url, "old-key", 0))[0] == 200
                # Load in flight: streams answering under the old key when the files change.
                answering = [asyncio.Event() for _ in range(16)]
                inflight = [asyncio.create_task(chat(session, gw.url, "old-key", seed, stream=True, answering=e))
                            for seed, e in enumerate(answering, 1)]
                await asyncio.wait_for(asyncio.gather(*(e.wait() for e in answering)), 30)
                keys.write_text('{"new-key": "acme"}')
                write_config(config, [sims[0].url, sims[2].url], keys, "t" * 16)
                gw.proc.send_signal(signal.SIGHUP)
                await until_reloaded(gw, "applied", 1)
                assert any(not t.done() for t in inflight)  # the reload happened under them
                done = await asyncio.gather(*inflight)
                assert [status for status, _ in done] == [200] * len(inflight)
                assert (await chat(session, gw.url, "old-key", 0))[0] == 401
                answered = {backend for _, backend in
                            await asyncio.gather(*(chat(session, gw.url, "new-key", s) for s in range(40)))}
                assert answered == {"vllm-0", "vllm-1"}  # the second is now sims[2], at the list's position
                assert await successes(session, sims[2].url) > 0  # it really joined
                metrics = scrape(gw)
                assert metric_value(metrics, "mmgate_requests_total", route="chat", status="500") == 0
                assert "tenant secret changed" in gw.log(tail=None)

                # A bad file: refused, logged, and every old value stays.
                config.write_text("backend = [\n")
                keys.write_text('{"newest-key": "acme"}')
                gw.proc.send_signal(signal.SIGHUP)
                await until_reloaded(gw, "refused", 1)
                assert "reload refused, the old settings stay: --config" in gw.log(tail=None)
                assert (await chat(session, gw.url, "new-key", 1))[0] == 200
                assert (await chat(session, gw.url, "newest-key", 1))[0] == 401
                # A bad keys file with a good config: refused too.
                write_config(config, [sims[1].url], keys, "t" * 16)
                keys.write_text("only-one-field\n")
                gw.proc.send_signal(signal.SIGHUP)
                await until_reloaded(gw, "refused", 2)
                assert "--api-keys-file" in gw.log(tail=None)
                assert {(await chat(session, gw.url, "new-key", s))[1] for s in range(10)} == {"vllm-0", "vllm-1"}
            assert metric_value(scrape(gw), "mmgate_reloads_total", result="applied") == 1
