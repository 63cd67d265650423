"""vLLM's prefix cache partitioned per tenant, against real vLLM: the gateway's ``cache_salt``
reaches vLLM on completions and chat (vLLM accepts it: 200, not its 400 for a bad salt), a
tenant's repeat of a prompt hits the prefix cache, another tenant's same prompt does not, and a
client's own salt partitions its tenant's requests further."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import aiohttp

from mmgate.reuse import KeySpace
from tests.support.recorder import recording_proxy
from tests.support.vllm import SERVED_MODEL, VllmReplica, _get, running_gateway_process
from tests.vllm.conftest import GATEWAY_FLAGS
from tests.vllm.helpers import REQUEST_TIMEOUT, body, chat

_HITS = re.compile(r"^vllm:prefix_cache_hits_total\{[^}]*\} ([0-9.e+]+)$", re.M)
# Long enough to fill several KV blocks whatever block size the CPU build picks.
SECRET = "salt-test-secret-0123456789"
PROMPT = " ".join(f"word{i}" for i in range(150))


def prefix_hits(replica: VllmReplica) -> float:
    """Tokens vLLM found in its prefix cache so far (``vllm:prefix_cache_hits_total``)."""
    return sum(float(v) for v in _HITS.findall(_get(replica.url + "/metrics", timeout=10.0)[1].decode()))


async def complete(url: str, headers: dict[str, str], **extra: Any) -> tuple[int, bytes]:
    payload = {"model": SERVED_MODEL, "prompt": PROMPT, "max_tokens": 1, **extra}
    async with aiohttp.ClientSession(timeout=REQUEST_TIMEOUT) as http, http.post(
            url + "/v1/completions", json=payload, headers=headers) as resp:
        return resp.status, await resp.read()


async def test_prefix_cache_is_partitioned_per_tenant(vllm_replicas: list[VllmReplica], tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("key-a tenant-a\nkey-b tenant-b\n")
    replica = vllm_replicas[0]
    a = {"Authorization": "Bearer key-a"}
    b = {"Authorization": "Bearer key-b"}
    async with recording_proxy(replica.url) as rec:
        with running_gateway_process([rec.url], tmp_path / "gw.log", "--api-keys-file", str(keys),
                                     "--tenant-secret", SECRET, *GATEWAY_FLAGS) as gw:
            first = await complete(gw.url, a)
            assert first == (200, ANY), first[1].decode()
            before_repeat = prefix_hits(replica)
            assert await complete(gw.url, a) == (200, ANY)  # A's repeat: its own prefix is cached
            after_repeat = prefix_hits(replica)
            assert await complete(gw.url, b) == (200, ANY)  # B's same prompt: not A's blocks
            after_b = prefix_hits(replica)
            assert await complete(gw.url, a, cache_salt="own") == (200, ANY)  # A's own salt: apart again
            after_salted = prefix_hits(replica)
            salted_chat = await chat(gw.url, body(text=PROMPT, cache_salt="own"), a)
    assert after_repeat > before_repeat
    assert after_b == after_repeat
    assert after_salted == after_b
    assert salted_chat.status == 200, salted_chat.json  # vLLM accepted the salt the gateway made
    # The proxy keeps chat bodies: the salt vLLM got is A's tag with A's own salt inside it.
    assert rec.bodies[-1]["cache_salt"] == KeySpace(SECRET.encode()).cache_salt("tenant-a", "own")
