"""Nothing one tenant does is observable by another, through a real gateway, real sims and a real
image origin: the same image (by data: URL and by http URL) loaded by tenant A is a fresh load for
tenant B — no local hit, no in-flight join, no metric that moves for B's sake — and each tenant's
requests carry a ``cache_salt`` of its own (vLLM's prefix cache), a client's own salt kept inside."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.gateway import gateway_settings, running_gateway, running_sims, vllm_specs
from tests.support.http import post
from tests.support.images import make_image, png_data_url
from tests.support.origin import ImageOrigin
from tests.support.recorder import recording_proxy
from tests.support.serve_process import metric_value


def turn(url: str, **extra: Any) -> dict[str, Any]:
    return {"model": "mmgate-sim-vl", "max_tokens": 1, **extra, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": url}}]}]}


ADMIN_KEY = "admin-key-0123456789abcdef"  # /metrics answers only it once API keys are set


async def metrics(url: str) -> str:
    import aiohttp
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as r:
        return await r.text()


async def test_one_tenants_images_are_not_anothers_cache_hits(tmp_path: Path, origin: ImageOrigin) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("key-a tenant-a\nkey-b tenant-b\n")
    admin = tmp_path / "admin.key"
    admin.write_text(ADMIN_KEY)
    a, b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    http_url = origin.add("shot.png", make_image("PNG", 40, 30))
    async with running_sims(1) as sims, recording_proxy(sims[0].url) as rec:
        async with running_gateway(gateway_settings(backends=vllm_specs([rec]), api_keys_file=str(keys),
                                                    admin_key_file=str(admin))) as gw:
            for url in (png_data_url(7), http_url):
                assert (await post(gw.url, turn(url), a))[0] == 200
                hits = metric_value(await metrics(gw.url), "mmgate_image_loads_total", outcome="local_hit")
                assert (await post(gw.url, turn(url), b))[0] == 200  # B's first: not A's cached image
                after = await metrics(gw.url)
                assert metric_value(after, "mmgate_image_loads_total", outcome="local_hit") == hits
                assert (await post(gw.url, turn(url), b))[0] == 200  # B's own repeat hits B's entry
                assert metric_value(await metrics(gw.url), "mmgate_image_loads_total",
                                    outcome="local_hit") == hits + 1
            assert origin.hits["/img/shot.png"] == 2  # fetched once per tenant
            salts = [body.get("cache_salt") for body in rec.bodies]  # A, B, B for each URL
            assert len({salts[0], salts[3]}) == 1 and len({salts[1], salts[2], salts[4], salts[5]}) == 1
            assert salts[0] != salts[1]
            assert all(isinstance(s, str) and s.startswith("t") for s in salts)
            assert (await post(gw.url, turn(png_data_url(7), cache_salt="mine"), a))[0] == 200
            assert rec.bodies[-1]["cache_salt"].startswith(f"{salts[0]}-")  # the client's salt, inside A's
            status, body, _ = await post(gw.url, turn(png_data_url(7), cache_salt=5), a)
            assert status == 400 and body["error"]["param"] == "cache_salt"
