"""The Grafana dashboard (deploy/grafana/mmgate.json) reads what a real gateway really exports:
every panel's queries are scraped for metric names, each checked against the /metrics page of a
real gateway (embedded sim engines, API keys) after traffic. A metric counted only on an event this
gateway does not meet (an ejection, a refused connection) must be declared on the page; those
registered only with a Redis or by the SIGHUP reloader are checked against their definitions in
tests/deploy/test_dashboard.py. vLLM's names are checked against a real vLLM replica in
tests/observe/test_vllm.py."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from tests.observe.dashboard import exported, names_in, panels
from tests.support.gateway import gateway_settings, running_gateway
from tests.support.images import png_data_url

KEY = "sk-dashboard-0123456789"
# Registered only with a Redis (--redis-url) or by the SIGHUP reloader, neither of which this gateway has.
ELSEWHERE = ("mmgate_shared_cache_", "mmgate_reloads_")
COUNTER_SUFFIXES = ("_total", "_count", "_bucket", "_sum")


async def test_every_panel_reads_metrics_a_real_gateway_exports(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text(f"{KEY} team-a\n")
    image = png_data_url(seed=3)
    body = {"model": "mmgate-sim-vl", "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}}]}]}
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json", "X-Session-Id": "s1"}
    admin = tmp_path / "admin.key"  # /metrics answers only the admin key once API keys are set
    admin.write_text("admin-key-0123456789abcdef")
    async with running_gateway(gateway_settings(api_keys_file=str(keys), admin_key_file=str(admin))) as gw, \
            aiohttp.ClientSession() as s:
        for _ in range(2):  # the second turn strips the image to a reference
            async with s.post(gw.url + "/v1/chat/completions", data=orjson.dumps(body), headers=headers) as r:
                assert r.status == 200
                await r.read()
        async with s.get(gw.url + "/metrics", headers={"Authorization": "Bearer admin-key-0123456789abcdef"}) as r:
            page = await r.text()
    names = exported(page)
    # Families on the page with no sample yet (labelled, counted on events): each sample name they will have.
    declared = {f.name + suffix for f in text_string_to_metric_families(page) for suffix in ("", *COUNTER_SUFFIXES)}
    assert "mmgate_tenant_tokens_total" in names  # the traffic reached the tenant counters
    drawn = panels()
    assert len(drawn) >= 10
    assert len({p["id"] for p in drawn}) == len(drawn)  # Grafana keys panels by id
    assert all(p["datasource"]["uid"] == "${datasource}" and p["gridPos"]["w"] <= 24 for p in drawn)
    for panel in drawn:
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        read = set().union(*(names_in(t["expr"]) for t in panel["targets"]))
        assert read, f"panel {panel['title']!r} names no metric"
        missing = {n for n in read if n.startswith("mmgate_") and not n.startswith(ELSEWHERE)} - names - declared
        assert not missing, f"panel {panel['title']!r} reads {sorted(missing)}, which the gateway does not export"
    # Both sides are on the dashboard: the gateway's metrics beside vLLM's own.
    everything = set().union(*(names_in(t["expr"]) for p in drawn for t in p["targets"]))
    assert any(n.startswith("vllm:") for n in everything) and any(n.startswith("mmgate_") for n in everything)
