"""The routing sync end to end: real gateway processes (``mmgate serve --routing-sync-url``), real
sim engines and real redis-server processes (standalone, and a 3-node cluster), all on loopback.
Each test also runs a gateway without the sync, which routes otherwise: that is what the sync
changes, so each would fail if the messages did not arrive or were not applied."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
import orjson
import pytest

from mmgate.routing import Routed, sync_message
from mmgate.routing.sync.peers import encode
from mmgate.routing.sync.seal import seal
from tests.routing.test_image_affinity_gateways import AFFINITY, body, data_url
from tests.routing.test_image_affinity_gateways import _metric as metric
from tests.support.gateway import running_sims
from tests.support.gateway_process import gateway_process
from tests.support.redis_servers import RedisClusterServers, RedisServer

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
    # The sender has sent what it had: an answered request goes out at once (10 ms at most).
    await asyncio.sleep(0.1)
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
        steer = [Routed(name, -1, (f"k{i}",)) for i, name in enumerate(names)]
        unsigned = [b"\x00" * 32 + b"0123456789abcdef" + bytes(8) + encode(steer),
                    b"{" * 50_000, orjson.dumps({"v": 3, "s": [[names[0], -1, ["k"]]]}).ljust(200, b" ")]
        forged = [sync_message(b"not the fleet's secret, 32+ chars", "0123456789abcdef", n, steer)
                  for n in range(3)]
        broken = seal(SECRET.encode(), "fedcba9876543210", 0, b'{"v":3,"s":{}}')  # signed, not a message
        with standalone_server.client() as raw:
            for data in [*garbage, *unsigned, *forged, broken]:
                raw.publish(channel, data)
            # Signed, but about backends this gateway does not have: applied, and changes nothing.
            raw.publish(channel, sync_message(SECRET.encode(), "fedcba9876543210", 1, [Routed("elsewhere", -1, ("k",))]))
        await until(lambda: _at_least(client, gw, INVALID, len(garbage) + 1))
        await until(lambda: _at_least(client, gw, FORGED, len(unsigned) + len(forged)))
        await until(lambda: _at_least(client, gw, RECEIVED_OK, 1))
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
                          *flags], capture_output=True, timeout=30)
    assert out.returncode == 2, out.stderr
    assert named in out.stderr and said in out.stderr
