"""Chaos run of the shared image tier: Redis frozen (SIGSTOP), killed and restarted under load.

Starts its own redis-server processes on loopback (a standalone server, then a 3-master cluster
with ``cluster-require-full-coverage no``), a loopback image origin that answers after a fixed
delay, and two ``MediaLoader``s — two gateway processes' media pipelines, each with its own
shared tier, local tier off, so every load asks Redis — driven by 8 closed-loop workers loading
random images of a pool. Phases: healthy, then each fault, then its recovery. Per phase it prints
requests, failed requests, p50/p99/max latency, shared hits, the hit rate of keys on nodes that
are up (compared with the healthy phase), the longest wait on another process's fill lease, and
for a recovery phase how long after the server (cluster) was ok the first hit on its keys came.

    .venv/bin/python benchmarks/regression/chaos_shared_tier.py --out results/chaos_shared_tier.json

``--label`` names the code under test in the rows, to put two checkouts' runs side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import random
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image
from prometheus_client import CollectorRegistry
from tests.support.origin import ImageOrigin
from tests.support.redis_servers import RedisClusterServers, RedisServer

from benchmarks._run import parse_args, write_results
from mmgate.config import CacheSettings, MediaSettings
from mmgate.media.keys import url_key
from mmgate.media.loader import MediaLoader
from mmgate.store import LoadedImage
from mmgate.store.redis.tier import RedisSharedTier, build_shared_tier

CONNECT_S = IO_S = 0.5
ORIGIN_DELAY_S = 0.05
WORKERS = 8
THINK_S = 0.02
POOL = 48
QUICK = {"only": "standalone", "phase_scale": 0.1}


@dataclass
class Phase:
    name: str
    down: set[str] = field(default_factory=set)  # node names whose keys are excluded from "up" rates
    recovering: set[str] = field(default_factory=set)  # nodes just back: time to their first hit
    latencies: list[float] = field(default_factory=list)
    failures: int = 0
    hits: int = 0
    up_requests: int = 0
    up_hits: int = 0
    lease_wait_max_s: float = 0.0
    started: float = 0.0
    first_hit_after_s: float | None = None

    def row(self, healthy_rate: float | None) -> dict[str, Any]:
        lat = sorted(self.latencies) or [0.0]
        up_rate = self.up_hits / self.up_requests if self.up_requests else None
        return {
            "phase": self.name, "requests": len(self.latencies), "failures": self.failures,
            "p50_ms": round(1000 * statistics.median(lat), 1),
            "p99_ms": round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 1),
            "max_ms": round(1000 * lat[-1], 1), "hits": self.hits,
            "up_hit_rate": None if up_rate is None else round(up_rate, 3),
            "up_vs_healthy": None if up_rate is None or not healthy_rate else round(up_rate / healthy_rate, 3),
            "lease_wait_max_ms": round(1000 * self.lease_wait_max_s, 1),
            "first_hit_after_ms": None if self.first_hit_after_s is None else round(1000 * self.first_hit_after_s),
        }


class Chaos:
    """The load: ``WORKERS`` loops over two loaders, recording into the current phase."""

    def __init__(self, urls: list[str], loaders: list[MediaLoader], tiers: list[RedisSharedTier],
                 owners: dict[str, str], phase_scale: float) -> None:
        self.urls, self.loaders, self.tiers, self.owners = urls, loaders, tiers, owners
        self.phase_scale = phase_scale
        self.phase = Phase("warm-up")
        self.phases: list[Phase] = []
        self._stop = False
        for tier in tiers:
            tier.wait_for_fill = self._timed_wait(tier.wait_for_fill)  # type: ignore[method-assign, assignment]

    def _timed_wait(
        self, wait: Callable[[str], Awaitable[LoadedImage | None]]
    ) -> Callable[[str], Coroutine[Any, Any, LoadedImage | None]]:
        async def timed(key: str) -> LoadedImage | None:
            start = time.monotonic()
            try:
                return await wait(key)
            finally:
                self.phase.lease_wait_max_s = max(self.phase.lease_wait_max_s, time.monotonic() - start)
        return timed

    async def worker(self, index: int) -> None:
        rng = random.Random(index)
        loader = self.loaders[index % len(self.loaders)]
        while not self._stop:
            url = rng.choice(self.urls)
            phase, node, start = self.phase, self.owners[url], time.monotonic()
            try:
                _, outcome = await loader.load_with_outcome(url)
            except Exception:  # a failed request: what the aims count
                phase.failures += 1
                outcome = "error"
            phase.latencies.append(time.monotonic() - start)
            hit = outcome == "shared_hit"
            phase.hits += hit
            if node not in phase.down:
                phase.up_requests += 1
                phase.up_hits += hit
            if hit and node in phase.recovering and phase.first_hit_after_s is None:
                phase.first_hit_after_s = time.monotonic() - phase.started
            await asyncio.sleep(THINK_S)

    async def run_phase(self, name: str, seconds: float, *, down: set[str] = frozenset(),  # type: ignore[assignment]
                        recovering: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.phase = Phase(name, set(down), set(recovering), started=time.monotonic())
        self.phases.append(self.phase)
        await asyncio.sleep(seconds * self.phase_scale)

    def stop(self) -> None:
        self._stop = True


def make_pool(origin: ImageOrigin) -> list[str]:
    urls = []
    for i in range(POOL):
        buf = io.BytesIO()
        Image.new("RGB", (64, 64), (i * 5 % 256, 80, 160)).save(buf, "PNG")
        name = f"chaos-{i}.png"
        origin.add(name, buf.getvalue())
        urls.append(origin.url(f"/slow-headers/{name}?delay={ORIGIN_DELAY_S}"))
    return urls


async def scenario(kind: str, tmp: Path, origin: ImageOrigin, urls: list[str], label: str,
                   phase_scale: float) -> list[dict[str, Any]]:
    cluster = kind == "cluster"
    servers = RedisClusterServers(tmp / "cluster") if cluster else None
    single = None if cluster else RedisServer(tmp / "standalone")
    await asyncio.to_thread(servers.start if servers else single.start)  # type: ignore[union-attr]
    url = servers.url if servers else single.url  # type: ignore[union-attr]
    cache = CacheSettings(redis_url=url, redis_cluster=cluster, redis_connect_timeout_s=CONNECT_S,
                          redis_io_timeout_s=IO_S, local_cache_bytes=0)
    media = MediaSettings(allowed_private=("127.0.0.1",))
    tiers = []
    for _ in range(2):
        tier = build_shared_tier(cache, media, CollectorRegistry())
        assert isinstance(tier, RedisSharedTier)
        await tier.start()
        tiers.append(tier)
    # The node holding each image's entry, asked of the cluster itself (not of the code under test).
    value_keys = [tiers[0].storage_keys(url_key(u))[0] for u in urls]
    if servers is not None:
        owners = dict(zip(urls, (f"127.0.0.1:{n.port}" for n in servers.nodes_for_keys(value_keys)), strict=True))
    else:
        owners = dict.fromkeys(urls, "standalone")
    loaders = [MediaLoader(media, cache, shared=t) for t in tiers]
    chaos = Chaos(urls, loaders, tiers, owners, phase_scale)
    workers = [asyncio.create_task(chaos.worker(i)) for i in range(WORKERS)]
    try:
        await chaos.run_phase("warm-up", 3)
        await chaos.run_phase("healthy", 5)
        if single is not None:
            name = {"standalone"}
            single.freeze()
            await chaos.run_phase("frozen", 3, down=name)
            single.thaw()
            await chaos.run_phase("thawed", 4, recovering=name)
            single.stop()
            await chaos.run_phase("killed", 3, down=name)
            await asyncio.to_thread(single.start)
            await chaos.run_phase("restarted", 5, recovering=name)
        else:
            nodes = servers.nodes  # type: ignore[union-attr]
            names = {n.port: f"127.0.0.1:{n.port}" for n in nodes}
            one, seed = nodes[1], nodes[0]
            one.freeze()
            await chaos.run_phase("one node frozen", 3, down={names[one.port]})
            one.thaw()
            await chaos.run_phase("one node thawed", 4, recovering={names[one.port]})
            one.stop()
            await chaos.run_phase("one node killed", 7, down={names[one.port]})  # > node timeout
            await asyncio.to_thread(one.start)
            await asyncio.to_thread(servers.wait_ready)  # type: ignore[union-attr]
            await chaos.run_phase("one node restarted", 5, recovering={names[one.port]})
            seed.stop()
            await chaos.run_phase("seed node killed", 4, down={names[seed.port]})
            await asyncio.to_thread(seed.start)
            await asyncio.to_thread(servers.wait_ready)  # type: ignore[union-attr]
            await chaos.run_phase("seed node restarted", 5, recovering={names[seed.port]})
            for n in nodes:
                n.freeze()
            await chaos.run_phase("all nodes frozen", 2, down=set(names.values()))
            for n in nodes:
                n.thaw()
            await chaos.run_phase("all nodes thawed", 4, recovering=set(names.values()))
            await asyncio.to_thread(servers.stop)  # type: ignore[union-attr]
            await chaos.run_phase("all nodes killed", 3, down=set(names.values()))
            await asyncio.to_thread(servers.start)  # type: ignore[union-attr]
            await chaos.run_phase("all nodes restarted", 5, recovering=set(names.values()))
    finally:
        chaos.stop()
        await asyncio.gather(*workers, return_exceptions=True)
        for loader in loaders:
            await loader.close()
        for tier in tiers:
            await tier.close()
        await asyncio.to_thread(servers.stop if servers else single.stop)  # type: ignore[union-attr]
    healthy = next(p for p in chaos.phases if p.name == "healthy")
    healthy_rate = healthy.up_hits / healthy.up_requests if healthy.up_requests else None
    return [{"code": label, "deployment": kind, **p.row(healthy_rate)} for p in chaos.phases if p.name != "warm-up"]


def print_table(rows: list[dict[str, Any]]) -> None:
    cols = ["code", "deployment", "phase", "requests", "failures", "p50_ms", "p99_ms", "max_ms", "hits",
            "up_hit_rate", "up_vs_healthy", "lease_wait_max_ms", "first_hit_after_ms"]
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in cols]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    for r in rows:
        print("  ".join(str(r[c]).ljust(w) for c, w in zip(cols, widths, strict=True)))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="results/chaos_shared_tier.json")
    parser.add_argument("--only", choices=["standalone", "cluster"], default=None)
    parser.add_argument("--label", default="mmgate", help="names the code under test in the rows")
    parser.add_argument("--phase-scale", type=float, default=1.0, help="every phase's length times this")
    args = parse_args(parser, QUICK)
    origin = await ImageOrigin().start()
    urls = make_pool(origin)
    rows: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="mmgate-chaos-") as tmp:
            for kind in ("standalone", "cluster"):
                if args.only in (None, kind):
                    rows += await scenario(kind, Path(tmp), origin, urls, args.label, args.phase_scale)
    finally:
        await origin.stop()
    print_table(rows)
    bound_ms = 1000 * (ORIGIN_DELAY_S + 2 * (CONNECT_S + IO_S))
    result = {
        "settings": {"redis_connect_timeout_s": CONNECT_S, "redis_io_timeout_s": IO_S, "fill_wait_s": 1.0,
                     "origin_delay_s": ORIGIN_DELAY_S, "workers": WORKERS, "think_s": THINK_S, "images": POOL,
                     "loaders": 2, "latency_bound_ms": bound_ms},
        "phases": rows,
    }
    print(f"latency bound (origin + 2 x (connect + io)): {bound_ms:.0f} ms")
    await asyncio.to_thread(write_results, args.out, result)


if __name__ == "__main__":
    asyncio.run(main())
