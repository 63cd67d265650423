"""Backend discovery (``mmgate.fleet.discovery``) against a real DNS server on loopback (dnslib):
each A/AAAA record a backend named by its address and the configured port, the set applied only
when it changes, fail static on SERVFAIL/NXDOMAIN/empty answers (counted), bounded by
``--max-backends``. The backends here are plain records (no I/O): what is checked is the set; the
last test runs a real gateway in front of a real (echo) backend."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from mmgate._settings import ConfigError
from mmgate.backends import BackendKind
from mmgate.config import BackendSpec, GatewaySettings
from mmgate.fleet.discovery import (
    BackendDiscovery,
    DiscoveryError,
    DnsResolver,
    Wanted,
    first_backends,
    wanted_backends,
)
from tests.backends.echo_server import echo_backend
from tests.fleet.dns import loopback_dns
from tests.support.gateway import gateway_settings, running_gateway
from tests.support.http import CHAT_PATH, post

NAME = "vllm.mmgate.svc.cluster.local"
# Loopback is special-purpose: these fleets run there, so the tests open it, as an operator would.
LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
DNS_SPEC = BackendSpec(kind="vllm", url=f"http://{NAME}:8000")


@dataclass
class Made:
    """Stands for an HTTPBackend: the set logic needs only name, kind and URL."""

    name: str
    kind: BackendKind
    url: str

    async def close(self) -> None:
        return None


def make(wanted: Wanted) -> Made:
    return Made(wanted.name, wanted.kind, wanted.url)


def test_the_set_is_static_first_then_each_address_by_name_deduplicated_and_bounded() -> None:
    static = [BackendSpec(kind="vllm", url="http://10.0.0.9:8000"), BackendSpec(kind="openai", url="https://api.x")]
    answers = [["10.0.0.9", "10.0.0.2", "fd00::5"]]
    wanted, left_out = wanted_backends(static, [DNS_SPEC], answers, max_backends=64)
    assert [(w.name, w.url) for w in wanted] == [
        ("vllm-0", "http://10.0.0.9:8000"), ("openai-1", "https://api.x"),
        ("10.0.0.2:8000", "http://10.0.0.2:8000"), ("[fd00::5]:8000", "http://[fd00::5]:8000")]
    assert wanted[2].configured_url == DNS_SPEC.url  # what the backend keys file names
    cut, left_out = wanted_backends(static, [DNS_SPEC], answers, max_backends=3)
    assert len(cut) == 3 and left_out == 1


async def test_a_dns_name_becomes_one_backend_per_record_and_follows_changes() -> None:
    with loopback_dns() as (records, server):
        records.set(NAME, ["127.0.0.3", "127.0.0.2", "::1"])
        registry = CollectorRegistry()
        discovery = BackendDiscovery([], [DNS_SPEC], make, resolver=DnsResolver(server), registry=registry,
                                     allowed=LOOPBACK)
        applied: list[list[str]] = []
        discovery.on_change(lambda backends: applied.append([b.name for b in backends]))
        first = await discovery.resolve()
        assert [b.name for b in first] == ["127.0.0.2:8000", "127.0.0.3:8000", "[::1]:8000"]
        assert await discovery.resolve() is first and len(applied) == 1  # unchanged: not applied again
        records.set(NAME, ["127.0.0.2", "127.0.0.3", "127.0.0.4"])
        second = await discovery.resolve()
        assert [b.name for b in second] == ["127.0.0.2:8000", "127.0.0.3:8000", "127.0.0.4:8000"]
        assert second[0] is first[0] and second[1] is first[1]  # backends that stay are the same objects
        assert registry.get_sample_value("mmgate_backends") == 3


@pytest.mark.parametrize("fault", ["servfail", "nxdomain", "empty"])
async def test_resolution_failure_keeps_the_last_known_set_and_counts(fault: str) -> None:
    with loopback_dns() as (records, server):
        records.set(NAME, ["127.0.0.2", "127.0.0.3"])
        registry = CollectorRegistry()
        discovery = BackendDiscovery([], [DNS_SPEC], make, resolver=DnsResolver(server, timeout_s=1.0),
                                     registry=registry, allowed=LOOPBACK)
        known = await discovery.resolve()
        if fault == "servfail":
            records.failing = True
        elif fault == "nxdomain":
            records.set("other.name", ["127.0.0.9"])
            records._names.pop(NAME)
        else:
            records.set(NAME, [])
        assert await discovery.resolve() is known
        assert registry.get_sample_value("mmgate_backend_discovery_failures_total") == 1
        records.failing = False
        records.set(NAME, ["127.0.0.2"])
        assert [b.name for b in await discovery.resolve()] == ["127.0.0.2:8000"]  # back in step


async def test_a_silent_server_is_a_bounded_discovery_error() -> None:
    resolver = DnsResolver("127.0.0.1:9", timeout_s=0.5)  # discard port: no answer
    with pytest.raises(DiscoveryError, match=NAME):
        await resolver.addresses(NAME)


def test_backend_dns_settings_are_checked_naming_the_flag() -> None:
    s = GatewaySettings(backend_dns=("vllm=http://vllm.ns.svc:8000",), backend_dns_server="127.0.0.1:5353")
    assert s.backend_dns[0].url == "http://vllm.ns.svc:8000"
    with pytest.raises(ConfigError, match="--backend-dns"):
        GatewaySettings(backend_dns=("vllm.ns.svc:8000",))
    with pytest.raises(ValueError, match="DNS server"):
        GatewaySettings(backend_dns_server="dns.example:53")


async def test_start_up_waits_for_a_first_answer_then_fails_naming_the_reason() -> None:
    with loopback_dns() as (records, server):
        discovery = BackendDiscovery([], [DNS_SPEC], make, resolver=DnsResolver(server, timeout_s=0.5),
                                     registry=CollectorRegistry(), allowed=LOOPBACK)
        with pytest.raises(DiscoveryError, match=r"no backend found in 0\.5 s"):
            await first_backends(discovery, timeout_s=0.5)
        records.set(NAME, ["127.0.0.2"])
        assert [b.name for b in await first_backends(discovery, timeout_s=5)] == ["127.0.0.2:8000"]


async def test_a_discovered_backend_gets_the_key_given_for_its_dns_url(tmp_path: Path) -> None:
    async with echo_backend(models=("m1",)) as echo:
        port = int(echo.url.rsplit(":", 1)[1])
        url = f"http://echo.fleet.test:{port}"
        keys = tmp_path / "backend-keys"
        keys.write_text(f"{url} backend-key-1\n")
        with loopback_dns() as (records, server):
            records.set("echo.fleet.test", ["127.0.0.1"])
            settings = gateway_settings(backend_dns=(f"vllm={url}",), backend_dns_server=server,
                                        backend_keys_file=str(keys), backend_dns_allowed=("127.0.0.1",))
            async with running_gateway(settings) as gw:
                assert [b.name for b in gw.gateway.router.backends] == [f"127.0.0.1:{port}"]
                reply = await post(gw.url, {"model": "m1", "messages": [{"role": "user", "content": "hi"}]})
        assert reply.status == 200
        assert [s.headers.get("Authorization") for s in echo.seen if s.path_qs == CHAT_PATH] == ["Bearer backend-key-1"]


def test_past_the_bound_the_members_serving_are_kept_before_new_ones() -> None:
    flood = [f"10.0.0.{i}" for i in range(1, 10)]
    serving = {"10.9.0.1:8000", "10.9.0.2:8000"}
    wanted, left_out = wanted_backends([], [DNS_SPEC], [[*flood, "10.9.0.1", "10.9.0.2"]], max_backends=4,
                                       members=serving)
    assert [w.name for w in wanted] == ["10.0.0.1:8000", "10.0.0.2:8000", "10.9.0.1:8000", "10.9.0.2:8000"]
    assert left_out == 7
    wanted, _ = wanted_backends([], [DNS_SPEC], [[*flood, "10.9.0.1", "10.9.0.2"]], max_backends=4)
    assert not serving & {w.name for w in wanted}  # what a gateway with no members takes: the answer's first
