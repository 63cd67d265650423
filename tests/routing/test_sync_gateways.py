"""The routing sync end to end: real gateway processes (``mmgate serve --routing-sync-url``), real
sim engines and real redis-server processes (standalone, and a 3-node cluster), all on loopback.
Each test also runs a gateway without the sync, which routes otherwise: that is what the sync
changes, so each would fail if the messages did not arrive or were not applied."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import aiohttp
import orjson
import pytest

from mmgate.routing import sync_message
from mmgate.routing.admission import seal
from mmgate.routing.peers import encode
from mmgate.routing.rendezvous import rendezvous_rank
from mmgate.sim.config import SimSettings
from tests.routing.test_image_affinity_gateways import AFFINITY, MODEL, body, data_url
from tests.routing.test_image_affinity_gateways import _metric as metric
from tests.support.gateway import running_sims
from tests.support.gateway_process import gateway_process
from tests.support.redis_servers import RedisClusterServers, RedisServer, running_standalone

# What one gateway knows of another's requests comes from the sync alone.
OWN_ONLY = AFFINITY
SENT_OK = 'mmgate_routing_sync_messages_total{direction="sent",outcome="ok"}'
RECEIVED_OK = 'mmgate_routing_sync_messages_total{direction="received",outcome="ok"}'
INVALID = 'mmgate_routing_sync_messages_total{direction="received",outcome="invalid"}'
FORGED = 'mmgate_routing_sync_messages_total{direction="received",outcome="forged"}'
SECRET = "the fleet's routing secret, at least 32 characters"
_SECRET_DIR = tempfile.TemporaryDirectory(prefix="mmgate-sync-secret-")
SECRET_FILE = Path(_SECRET_DIR.name) / "secret"
SECRET_FILE.write_text(SECRET + "\n")


def synced(url: str, *extra: str, shared_cache: bool = False) -> tuple[str, ...]:
    """The sync on ``url``: its own Redis (``--routing-sync-url``), or the shared cache's
    (``--routing-sync`` with ``--redis-url``), signed with the fleet's secret."""
    sync = ("--redis-url", url, "--routing-sync") if shared_cache else ("--routing-sync-url", url)
    return (*OWN_ONLY, *sync, "--routing-sync-secret-file", str(SECRET_FILE), *extra)


async def choice(client: aiohttp.ClientSession, gw: str, images: list[str], session: str | None = None) -> str:
    headers = {"Content-Type": "application/json", **({"x-session-id": session} if session else {})}
    async with client.post(gw + "/v1/chat/completions", data=body(images), headers=headers) as r:
        assert r.status == 200, await r.text()
        await r.read()
        return r.headers["x-mmgate-backend"]


async def until(condition: object, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not await condition():  # type: ignore[operator]
            await asyncio.sleep(0.02)


async def delivered(client: aiohttp.ClientSession, sender: str, receiver: str) -> None:
    """Wait until ``receiver`` applied every message ``sender`` had sent 0.1 s from now."""
    # The sender has sent what it had: a change goes out at once, or, if it has not heard the
    # receiver's heartbeat yet (alone on the channel), with its own heartbeat (max age / 3, 0.33 s).
    await asyncio.sleep(0.45)
    sent = await metric(client, sender, SENT_OK)
    assert sent >= 1
    await until(lambda: _at_least(client, receiver, RECEIVED_OK, sent))


async def _at_least(client: aiohttp.ClientSession, gw: str, sample: str, value: float) -> bool:
    return await metric(client, gw, sample) >= value


@pytest.mark.parametrize("redis_kind", ["standalone", "cluster"])
async def test_a_gateway_sends_an_image_where_another_gateway_had_it_processed(
    redis_kind: str, request: pytest.FixtureRequest,
) -> None:
    if redis_kind == "cluster":  # each gateway on a different node: PUBLISH reaches every node
        cluster: RedisClusterServers = request.getfixturevalue("cluster_servers")
        url_a, url_b = cluster.nodes[0].url, cluster.nodes[1].url
    else:
        server: RedisServer = request.getfixturevalue("standalone_server")
        url_a = url_b = server.url
    async with running_sims(4) as sims, AsyncExitStack() as stack:
        urls = [s.url for s in sims]
        a = await stack.enter_async_context(gateway_process(urls, *synced(url_a), hash_seed=1))
        # B: the sync on the shared cache's Redis (standalone), or on its own (a cluster node).
        b = await stack.enter_async_context(
            gateway_process(urls, *synced(url_b, shared_cache=redis_kind == "standalone"), hash_seed=2))
        blind = await stack.enter_async_context(gateway_process(urls, *OWN_ONLY, hash_seed=3))
        client = await stack.enter_async_context(aiohttp.ClientSession())
        for seed in range(20):
            image = data_url(5000 + seed)
            # Through A, a session's new image goes to the session's home, where it is processed...
            held = await choice(client, a, [image], session=f"conversation-{seed}")
            # ...and a gateway that never heard of it sends it, shared now, to its own home.
            home = await choice(client, blind, [image])
            if held != home:
                break
        else:
            pytest.fail("no image whose home differs from its session's home in 20 tries")
        await delivered(client, a, b)
        processed = sum(s.engine.metrics.stats.images_processed for s in sims)
        # B heard where A's request was answered: the backend that holds it beats its home, and
        # B's sender strips it there (one record: the sync's entries are the sender's too).
        async with client.post(b + "/v1/chat/completions", data=body([image]),
                               headers={"Content-Type": "application/json"}) as r:
            assert r.status == 200, await r.text()
            await r.read()
            assert r.headers["x-mmgate-backend"] == held
            assert r.headers["x-mmgate-reuse"].startswith("sent=0; stripped=1"), r.headers["x-mmgate-reuse"]
        assert sum(s.engine.metrics.stats.images_processed for s in sims) == processed  # nothing again
        assert await metric(client, b, "mmgate_routing_sync_peers") == 1.0  # A (the blind one is not in it)


@asynccontextmanager
async def held_streams(client: aiohttp.ClientSession, gw: str, session: str, count: int) -> AsyncIterator[None]:
    """``count`` slow streams through ``gw`` for ``session`` (text only: they go to its home)."""
    streams = []
    try:
        for _ in range(count):
            resp = await client.post(gw + "/v1/chat/completions", json={
                "model": MODEL, "stream": True, "max_tokens": 2000, "ignore_eos": True,
                "messages": [{"role": "user", "content": "busy"}]}, headers={"x-session-id": session})
            assert resp.status == 200
            await resp.content.readuntil(b"\n\n")  # running on the engine
            streams.append(resp)
        yield
    finally:
        for resp in streams:
            resp.close()


async def test_the_load_cap_counts_another_gateways_requests_and_fails_open_when_redis_stops(
    tmp_path: Path,
) -> None:
    slow = SimSettings(port=0, speedup=1.0, decode_ms_per_token=20.0)
    async with running_sims(4, slow) as sims, AsyncExitStack() as stack:
        server = stack.enter_context(running_standalone(tmp_path / "redis"))
        urls = [s.url for s in sims]
        a = await stack.enter_async_context(gateway_process(urls, *synced(server.url)))
        b = await stack.enter_async_context(gateway_process(urls, *synced(server.url)))
        blind = await stack.enter_async_context(gateway_process(urls, *OWN_ONLY))
        client = await stack.enter_async_context(aiohttp.ClientSession())
        image = data_url(77, 112)
        home = await choice(client, b, [image])  # idle: the image's home
        assert await choice(client, blind, [image]) == home
        async with client.get(b + "/health") as r:
            names = [x["name"] for x in orjson.loads(await r.read())["backends"]]
        session = next(f"s{i}" for i in range(1000) if rendezvous_rank(f"s{i}", names)[0] == names.index(home))
        load = f'mmgate_backend_load{{backend="{home}"}}'
        async with held_streams(client, a, session, 6):
            # B counts A's 6 requests on the home (its own count is 0): over the cap, it spills.
            await until(lambda: _at_least(client, b, load, 6))
            assert await choice(client, b, [image]) != home
            assert await choice(client, blind, [image]) == home  # without the sync: idle, home
            server.stop()  # Redis gone: A's counts age out (max age 1 s) and B routes on its own
            await until(lambda: _at_most(client, b, load, 0))
            assert await choice(client, b, [image]) == home
            assert await choice(client, a, [data_url(78)]) in names  # A serves too
            server.start()  # back: A's next message (at least every max age / 3) reaches B again
            await until(lambda: _at_least(client, b, load, 6), timeout_s=15)
            assert await choice(client, b, [image]) != home
        errors = 'mmgate_routing_sync_messages_total{direction="sent",outcome="error"}'
        assert await metric(client, a, errors) >= 1


async def _at_most(client: aiohttp.ClientSession, gw: str, sample: str, value: float) -> bool:
    return await metric(client, gw, sample) <= value


async def test_garbage_and_forgeries_on_the_channel_are_refused_and_change_nothing(standalone_server: RedisServer) -> None:
    channel = "mmgate:routing:garbage-test"
    async with running_sims(2) as sims, gateway_process(
        [s.url for s in sims], *synced(standalone_server.url, "--routing-sync-channel", channel),
    ) as gw, aiohttp.ClientSession() as client:
        async with client.get(gw + "/health") as r:
            names = [x["name"] for x in orjson.loads(await r.read())["backends"]]
        image = data_url(91)
        before = await choice(client, gw, [image])
        garbage = [b"", b"\x00\xff" * 20, b"x" * 300_000]  # not even the size of a signed message
        heavy = {names[0]: 50}
        unsigned = [b"\x00" * 32 + b"0123456789abcdef" + bytes(8) + encode(heavy, []),
                    b"{" * 50_000, orjson.dumps({"v": 2, "l": heavy, "s": []}).ljust(200, b" ")]
        forged = [sync_message(b"not the fleet's secret, 32+ chars", "0123456789abcdef", n, heavy, [])
                  for n in range(3)]
        broken = seal(SECRET.encode(), "fedcba9876543210", 0, b'{"v":2,"l":[]}')  # signed, not a message
        with standalone_server.client() as raw:
            for data in [*garbage, *unsigned, *forged, broken]:
                raw.publish(channel, data)
            # Signed, but about backends this gateway does not have: applied, and changes nothing.
            raw.publish(channel, sync_message(SECRET.encode(), "fedcba9876543210", 1, {"elsewhere": 50}, []))
        await until(lambda: _at_least(client, gw, INVALID, len(garbage) + 1))
        await until(lambda: _at_least(client, gw, FORGED, len(unsigned) + len(forged)))
        await until(lambda: _at_least(client, gw, RECEIVED_OK, 1))
        for name in names:
            assert await metric(client, gw, f'mmgate_backend_load{{backend="{name}"}}') == 0.0
        assert await choice(client, gw, [image]) == before
        async with client.get(gw + "/health") as r:
            assert r.status == 200


@pytest.mark.parametrize(("flags", "named", "said"), [
    (("--routing-sync-url", "http://127.0.0.1:6379"), b"--routing-sync-url", b"redis://"),
    (("--routing-sync",), b"--routing-sync", b"--redis-url"),
    (("--routing-sync-url", "redis://127.0.0.1:9"), b"--routing-sync-secret-file", b"shared secret"),
    (("--routing-sync-url", "redis://127.0.0.1:9", "--routing-sync-secret-file", __file__),
     b"--routing-sync-secret-file", b"printable ASCII"),
])
def test_a_sync_without_a_usable_redis_is_refused_at_start_naming_the_flag(
    flags: tuple[str, ...], named: bytes, said: bytes,
) -> None:
    out = subprocess.run([sys.executable, "-m", "mmgate", "serve", "--backend", "vllm=http://127.0.0.1:9",
                          "--no-front-door", *flags], capture_output=True, timeout=30)
    assert out.returncode == 2, out.stderr
    assert named in out.stderr and said in out.stderr
