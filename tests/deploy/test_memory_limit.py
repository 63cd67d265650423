"""The gateway container under its own memory limit: the image run with the production overlay's
Deployment as docker can run it — its memory limit (``--memory``, no swap), every env value (cache
sizes, uuid store, decode queue, body cap and the rest, read from the rendered manifest, Secret
references resolved from the rendered Secret), its Secret files mounted where the pod mounts them,
its emptyDir as a tmpfs of its size limit, its user, read-only root and dropped capabilities — and
driven with image load until both caches are full, then harder (new images, uuid-only references,
24-megapixel JPEGs through the large decode lane, bodies near the body cap) while the cgroup's
memory is sampled. Docker restarts the gateway if it dies (``--restart on-failure``, as the kubelet
would). It holds when no process of the container was OOM-killed, it never restarted,
it answered every request with 200 or the 429 of a full decode queue, and its peak stayed under the
limit with HEADROOM to spare.

What stands in for the cluster: the vLLM replicas are one ``mmgate sim`` container (a vLLM
stand-in, with a processor cache smaller than the 4 GB the gateway assumes, so that a repeat may
miss and be healed from the uuid store), the Redis Cluster is a real 3-master cluster on loopback, the
image origin a loopback server of this test, all on the host's network (the manifest's DNS
discovery is replaced by the sim's static address, and loopback is opened to image URLs).

Skipped, with the reason, where docker cannot run (see tests/deploy/image.py) or kubectl is missing.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.deploy.image import docker, free_port, health, unusable_reason, wait_for
from tests.deploy.manifests import OVERLAYS, kubectl, render
from tests.deploy.memory_load import (
    CgroupMemory,
    GatewayPod,
    ImageOrigin,
    Outcomes,
    chat_body,
    data_url_png,
    image_part,
    noise_png,
    post_chat,
)
from tests.support.redis_servers import RedisClusterServers

REASON = unusable_reason() or (None if kubectl() else "kubectl is not on PATH (the manifest is rendered)")
needs_docker = pytest.mark.skipif(REASON is not None, reason=f"memory limit test: {REASON}")

PRODUCTION = next(p for p in OVERLAYS if p.name == "production")
# The settings that bound the gateway's memory: the manifest must state each (not leave it to a
# default that may change under it), and the test runs with what it states.
MEMORY_SETTINGS = ("MMGATE_LOCAL_CACHE_BYTES", "MMGATE_UUID_STORE_BYTES", "MMGATE_MAX_DECODE_QUEUE_PIXELS",
                   "MMGATE_MAX_BODY_BYTES")
# The Deployment's wiring to the cluster, replaced by the test's stand-ins.
DROPPED = {"MMGATE_BACKEND_DNS", "MMGATE_BACKEND_DNS_START_TIMEOUT", "REDIS_PASSWORD"}
# The peak must stay this share of the limit below it: room for what this load does not do.
HEADROOM = 0.10
MODEL = "mmgate-sim-vl"
# 1-megapixel noise PNGs: 3.1 MB each, ~7.3 MB of cache footprint (bytes and data URL).
PNG_SIDE = 1024
LARGE_JPEG = (6000, 4000)  # 24 megapixels: the large decode lane (over --large-image-pixels)
LARGE_PER_REQUEST = 4
FILL_WORKERS = 6
PRESSURE_S = 45
# Bodies near the cap: this many images each (under --max-images-per-request), this many at once.
BODY_IMAGES = 12
BODY_STREAMS = 4
BODY_FILL = 0.9
SIM_CACHE_GB = 0.5


def fill_count(budget: int, footprint: int) -> int:
    """Images of ``footprint`` bytes that overfill a cache of ``budget`` bytes by half."""
    return int(1.5 * budget / footprint) + 1


def metric(url: str, admin_key: str, name: str) -> float:
    """A gauge of the gateway's /metrics; -1 when the gateway does not answer."""
    request = urllib.request.Request(url + "/metrics", headers={"Authorization": f"Bearer {admin_key}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read().decode()
    except OSError:  # refused or reset: the gateway is down (the assertions below say why)
        return -1
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


@needs_docker
@pytest.mark.timeout(1800)
def test_gateway_holds_its_memory_limit_with_full_caches(
    image: str, cluster_servers: RedisClusterServers, tmp_path: Path,
) -> None:
    pod = GatewayPod.from_rendered(render(PRODUCTION))
    missing = [name for name in MEMORY_SETTINGS if name not in pod.env]
    assert not missing, f"the Deployment leaves {missing} to the gateway's defaults"
    local_cache, uuid_store, _, max_body = (int(pod.env[name]) for name in MEMORY_SETTINGS)
    api_key = next(iter(json.loads(pod.file(pod.env["MMGATE_API_KEYS_FILE"]))))
    admin_key = pod.file(pod.env["MMGATE_ADMIN_KEY_FILE"]).strip()

    sim_port, port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    chat = url + "/v1/chat/completions"
    overrides = {"MMGATE_HOST": "127.0.0.1", "MMGATE_PORT": str(port),
                 "MMGATE_BACKEND": f"vllm=http://127.0.0.1:{sim_port}",
                 "MMGATE_REDIS_URL": cluster_servers.url, "MMGATE_ALLOWED_PRIVATE": "127.0.0.1"}
    names: list[str] = []
    outcomes = Outcomes()
    with ImageOrigin(LARGE_JPEG) as origin:
        try:
            names.append(docker("run", "--detach", "--network", "host", "--entrypoint", "mmgate", image, "sim",
                                "--host", "127.0.0.1", "--port", str(sim_port),
                                "--mm-processor-cache-gb", str(SIM_CACHE_GB), "--no-decode-on-hit",
                                "--speedup", "20").stdout.strip())
            gateway = docker("run", "--detach", "--network", "host", "--restart", "on-failure:5",
                             *pod.docker_args(tmp_path, overrides, DROPPED), image).stdout.strip()
            names.append(gateway)
            assert wait_for(lambda: (health(url) or {}).get("status") == "ok", 90), \
                docker("logs", gateway).stderr[-3000:]
            with CgroupMemory(gateway) as memory:
                baseline = memory.usage()
                png_bytes = len(noise_png(0, PNG_SIDE, PNG_SIDE))
                footprint = png_bytes + 4 * ((png_bytes + 2) // 3)  # what a cache counts: bytes + data URL

                # 1. The uuid store: images sent with uuids, half again its budget.
                uuids = [f"memory-{i}" for i in range(fill_count(uuid_store, footprint))]
                with ThreadPoolExecutor(FILL_WORKERS) as pool:
                    for i, uuid in enumerate(uuids):
                        body = chat_body(MODEL, [image_part(origin.png(i, PNG_SIDE, PNG_SIDE), uuid)])
                        pool.submit(post_chat, chat, body, api_key, f"s{i % 32}", outcomes, "uuid fill")
                # 2. The image cache: other images, no uuid, half again its budget: the uuid store's
                # images leave the cache, so the two hold different images.
                first = len(uuids)
                with ThreadPoolExecutor(FILL_WORKERS) as pool:
                    for i in range(first, first + fill_count(local_cache, footprint)):
                        body = chat_body(MODEL, [image_part(origin.png(i, PNG_SIDE, PNG_SIDE))])
                        pool.submit(post_chat, chat, body, api_key, f"s{i % 32}", outcomes, "cache fill")
                cache_full = metric(url, admin_key, "mmgate_local_cache_bytes")
                after_fill = memory.usage()

                # 3. Pressure, caches full: each kind of load in threads of its own until the deadline.
                deadline = time.monotonic() + PRESSURE_S
                counter = iter(range(10**6, 10**9))
                lock = threading.Lock()

                def next_seed() -> int:
                    with lock:
                        return next(counter)

                def churn() -> None:
                    while time.monotonic() < deadline:
                        seeds = [next_seed(), next_seed()]
                        body = chat_body(MODEL, [image_part(origin.png(s, PNG_SIDE, PNG_SIDE)) for s in seeds])
                        post_chat(chat, body, api_key, f"c{seeds[0] % 32}", outcomes, "new images")

                def references() -> None:
                    kept = uuids[-int(uuid_store / footprint * 0.8):]  # still in the uuid store
                    i = 0
                    while time.monotonic() < deadline:
                        body = chat_body(MODEL, [image_part(None, kept[i % len(kept)])])
                        post_chat(chat, body, api_key, f"r{i % 32}", outcomes, "uuid references")
                        i += 1

                def large() -> None:
                    while time.monotonic() < deadline:
                        seed = next_seed()
                        parts = [image_part(origin.jpeg(seed + k, f"{seed}-{k}")) for k in range(LARGE_PER_REQUEST)]
                        post_chat(chat, chat_body(MODEL, parts), api_key, f"l{seed % 32}", outcomes, "large JPEGs")

                image_bytes = int(max_body * BODY_FILL / BODY_IMAGES * 3 / 4)
                width = 2048
                height = image_bytes // (3 * width + 1)

                def bodies() -> None:
                    while time.monotonic() < deadline:
                        parts = [image_part(data_url_png(next_seed(), width, height)) for _ in range(BODY_IMAGES)]
                        body = chat_body(MODEL, parts)
                        assert len(body) <= max_body
                        post_chat(chat, body, api_key, "b", outcomes, "bodies near the cap")
                        del body, parts

                loads = [churn, churn, references, large, large] + [bodies] * BODY_STREAMS
                threads = [threading.Thread(target=load, daemon=True) for load in loads]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(PRESSURE_S + 300)
                cache_end = metric(url, admin_key, "mmgate_local_cache_bytes")
                peak, oom_kills, stat = memory.peak(), memory.oom_kills(), memory.stat()
                end = memory.usage()
            state = json.loads(docker("inspect", "--format", "{{json .State}}", gateway).stdout)
            restarts = int(docker("inspect", "--format", "{{.RestartCount}}", gateway).stdout)
            logs = docker("logs", gateway)
        finally:
            for name in names:
                docker("rm", "--force", name, check=False)

    mib = 1 << 20
    rss = stat.get("total_rss", stat.get("anon", 0))
    print(f"\nlimit {pod.memory_limit / mib:.0f} MiB; settings: local cache {local_cache / mib:.0f} MiB, uuid store "
          f"{uuid_store / mib:.0f} MiB, body cap {max_body / mib:.0f} MiB, {BODY_STREAMS} bodies of "
          f"{BODY_IMAGES} x {image_bytes / mib:.1f} MiB PNGs at once")
    print(f"memory (cgroup): started {baseline / mib:.0f} MiB, caches full {after_fill / mib:.0f} MiB, peak "
          f"{peak / mib:.0f} MiB ({peak / pod.memory_limit:.0%} of the limit), end {end / mib:.0f} MiB "
          f"(rss {rss / mib:.0f} MiB); OOM kills {oom_kills}, restarts {restarts}")
    print(f"image cache {cache_full / mib:.0f} MiB after the fill, {cache_end / mib:.0f} MiB at the end; "
          f"origin served {origin.bytes_served / 1e6:.0f} MB")
    print(f"answers: {outcomes.counts}")
    print(f"processes at the sampled peak ({memory.peak_sampled / mib:.0f} MiB), resident MiB: {memory.at_peak}")
    assert oom_kills == 0 and not state["OOMKilled"] and restarts == 0 and state["Running"], \
        (state, logs.stderr[-3000:])
    assert peak < pod.memory_limit * (1 - HEADROOM), f"peak {peak / mib:.0f} MiB of {pod.memory_limit / mib:.0f} MiB"
    assert cache_full >= 0.9 * local_cache and cache_end >= 0.9 * local_cache
    assert not outcomes.errors, outcomes.errors
    for kind, by_status in outcomes.counts.items():
        assert by_status.get(200, 0) > 0, (kind, by_status)
        assert set(by_status) <= {200, 429}, (kind, by_status)
        assert 429 not in by_status or kind == "large JPEGs", (kind, by_status)
    assert "Traceback" not in logs.stdout + logs.stderr, logs.stderr[-3000:]
