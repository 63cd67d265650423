"""vLLM's ``cache_salt`` set per tenant on every endpoint whose request vLLM salts its prefix cache
with (completions, the pooling family), through a real gateway in front of real HTTP echo backends
that keep the bodies they got: a client's own salt stays inside its tenant, a salt vLLM would
refuse is the client's 400 naming ``cache_salt``, and endpoints without a prefix cache get none."""

from __future__ import annotations

from pathlib import Path

import orjson

from mmgate.reuse import KeySpace
from tests.api.test_endpoints import JSON_ENDPOINTS, call, fleet

SALTED = ("/v1/completions", "/v1/embeddings", "/pooling", "/classify", "/score", "/v1/score", "/rerank",
          "/v1/rerank", "/v2/rerank")
A = {"Authorization": "Bearer key-a"}
B = {"Authorization": "Bearer key-b"}


def keys_file(tmp_path: Path) -> str:
    path = tmp_path / "keys.txt"
    path.write_text("key-a tenant-a\nkey-b tenant-b\n")
    return str(path)


async def test_each_tenant_gets_its_own_salt_on_every_salted_endpoint(tmp_path: Path) -> None:
    async with fleet(models=(("m1",),), api_keys_file=keys_file(tmp_path)) as (gw, backends):
        seen = backends[0].seen
        salts: dict[str, list[object]] = {}
        for path in JSON_ENDPOINTS:
            for who in (A, B):
                for client_salt in (None, "mine"):
                    body: dict[str, object] = {"model": "m1", "prompt": "p"}
                    if client_salt is not None:
                        body["cache_salt"] = client_salt
                    status, answer, _, _ = await call("POST", gw.url + path, body=body, headers=who)
                    assert status == 200, (path, answer)
                    salts.setdefault(path, []).append(orjson.loads(seen[-1].body).get("cache_salt"))
    for path in JSON_ENDPOINTS:
        got = salts[path]
        if path not in SALTED:  # /tokenize, /detokenize: no prefix cache, forwarded as they came
            assert got == [None, "mine", None, "mine"], path
            continue
        a_own, a_mine, b_own, b_mine = got
        assert len({a_own, a_mine, b_own, b_mine}) == 4, path  # the client's salt never crosses tenants
        for salt in got:
            assert isinstance(salt, str) and len(salt) <= 128 and not set("@/\\\x00") & set(salt), salt
        assert isinstance(a_mine, str) and isinstance(a_own, str) and a_mine.startswith(a_own + "-")
    assert salts["/v1/completions"] == salts["/rerank"]  # one tenant's salt is the same everywhere


async def test_a_salt_vllm_would_refuse_is_the_clients_400(tmp_path: Path) -> None:
    async with fleet(models=(("m1",),), api_keys_file=keys_file(tmp_path)) as (gw, backends):
        for bad in (5, "", "a/b", "x@y", "x" * 129):
            for path in ("/v1/completions", "/v1/chat/completions"):
                body = {"model": "m1", "prompt": "p", "cache_salt": bad,
                        "messages": [{"role": "user", "content": "hi"}]}
                status, answer, _, _ = await call("POST", gw.url + path, body=body, headers=A)
                assert status == 400, (path, bad, answer)
                assert answer["error"]["param"] == "cache_salt", answer
        assert backends[0].seen == []  # refused at the gateway: nothing reached the backend


def test_the_salt_is_bounded_and_tenant_led() -> None:
    keys = KeySpace(b"s" * 32)
    longest = keys.cache_salt("tenant-a", "z" * 128)
    assert longest.startswith(keys.tenant_tag("tenant-a") + "-") and len(longest) == 66
    assert keys.cache_salt("tenant-a", "s1") != keys.cache_salt("tenant-a", "s2")
    assert keys.cache_salt("tenant-a", "s1") != keys.cache_salt("tenant-b", "s1")
    assert keys.cache_salt("tenant-a", None) == keys.tenant_tag("tenant-a")
