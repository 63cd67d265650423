"""What ``/health`` and ``/metrics`` tell whom, through a real gateway with API keys and an admin
key: a probe gets the status and counts, never the backends' internal addresses; the operator (the
admin key) gets the detail and the Prometheus page; without an admin key /metrics stays open only on
a gateway without API keys."""

from __future__ import annotations

import logging
from pathlib import Path

import aiohttp
import pytest

from tests.support.gateway import gateway_settings, running_gateway


async def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers) as r:
        return r.status, await r.text()


async def test_health_and_metrics_with_tenants_and_an_admin_key(tmp_path: Path) -> None:
    keys, admin = tmp_path / "keys.txt", tmp_path / "admin.key"
    keys.write_text("key-a tenant-a\n")
    admin.write_text("op-secret-0123456789\n")
    async with running_gateway(gateway_settings(api_keys_file=str(keys), admin_key_file=str(admin))) as gw:
        engine_url = gw.gateway.router.backends[0].url
        status, text = await get(gw.url + "/health")
        assert status == 200 and '"backends_healthy":2' in text and '"backends_total":2' in text
        assert engine_url not in text and "127.0.0.1" not in text
        status, text = await get(gw.url + "/health", {"Authorization": "Bearer key-a"})  # a tenant: no detail
        assert status == 200 and engine_url not in text
        status, text = await get(gw.url + "/health", {"X-Mmgate-Admin-Key": "op-secret-0123456789"})
        assert status == 200 and engine_url in text
        for headers in (None, {"Authorization": "Bearer key-a"}, {"X-Mmgate-Admin-Key": "wrong"}):
            status, text = await get(gw.url + "/metrics", headers)
            assert status == 403 and "admin key" in text
        for headers in ({"Authorization": "Bearer op-secret-0123456789"}, {"X-Mmgate-Admin-Key": "op-secret-0123456789"}):
            status, text = await get(gw.url + "/metrics", headers)
            assert status == 200 and "mmgate_requests_total" in text


async def test_without_an_admin_key_metrics_stay_open(tmp_path: Path) -> None:
    async with running_gateway(gateway_settings()) as gw:
        status, text = await get(gw.url + "/metrics")
        assert status == 200 and "mmgate_requests_total" in text
        status, text = await get(gw.url + "/health")  # no API keys: an open gateway shows the detail
        assert status == 200 and gw.gateway.router.backends[0].url in text


async def test_with_api_keys_and_no_admin_key_metrics_are_closed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The mmgate_tenant_* labels name every tenant: with API keys, /metrics is the operator's, and
    a gateway that has no admin key answers it to nobody (and says at start how to open it)."""
    keys = tmp_path / "keys.txt"
    keys.write_text("key-a tenant-a\nkey-b tenant-b\n")
    with caplog.at_level(logging.WARNING, logger="mmgate.api.app"):
        async with running_gateway(gateway_settings(api_keys_file=str(keys))) as gw:
            for headers in (None, {"Authorization": "Bearer key-a"}, {"X-Mmgate-Admin-Key": "key-b"}):
                status, text = await get(gw.url + "/metrics", headers)
                assert status == 403 and "admin key" in text and "tenant-a" not in text
            status, _ = await get(gw.url + "/load")  # what the manifests' liveness probe asks
            assert status == 200
    assert any("--admin-key-file" in r.getMessage() and "/metrics" in r.getMessage() for r in caplog.records)
