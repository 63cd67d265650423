"""The gateway's backend set: the static ``--backend`` list plus one backend per address that each
``--backend-dns`` name resolves to (a Kubernetes headless Service lists its ready pods' addresses),
re-resolved every ``--backend-dns-interval``.

The routing keys are backend names, so a discovered backend's name is its address and port
(``10.0.0.7:8000``): every gateway that sees the same DNS answer builds the same set, in any order
of the records, and a replica that appears or disappears moves only the sessions and images whose
rendezvous home it wins or held. Backends that stay are the same objects (their connection pools,
health, loads and holdings stay); the set is handed to ``apply`` (``Router.set_backends``) only
when it changed, and from then on the router owns the backends: it closes one that left once its
requests in flight have ended.

Only what an operator allowed: special-purpose addresses in an answer (loopback, link-local,
metadata …) are refused unless ``--backend-dns-allowed`` opens them (``dns_admission``), logged.

Fail static: a name that does not resolve, or resolves to nothing allowed, keeps its last known
addresses (logged and counted in ``mmgate_backend_discovery_failures_total``); the set is never
emptied by DNS. It is bounded: at most ``max_backends`` backends; an answer larger than that keeps
the members already serving and adds new ones up to the bound, the rest left out and logged (a
flood of records cannot push the real replicas out).

A change never fails a request: when members leave while others join, the joiners first serve
beside the leavers until the router has asked them for their models (``settle``), and only then do
the leavers go (the router drains them: their requests in flight finish). A flapping answer
moves requests, never to a backend that cannot take them yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import dns.asyncresolver
import dns.exception
import dns.resolver
from prometheus_client import CollectorRegistry, Counter, Gauge

from mmgate._settings import ConfigError
from mmgate.app_runtime import STOP_WAIT_S, stop_tasks
from mmgate.backends.base import Backend, BackendKind
from mmgate.config import BackendSpec, dns_server_address
from mmgate.fleet.dns_admission import admitted
from mmgate.media.addresses import IPNetwork

log = logging.getLogger(__name__)

# Seconds one resolution (A and AAAA together, retries included) may take.
RESOLVE_TIMEOUT_S = 3.0
RECORD_TYPES = ("A", "AAAA")
# Longest wait for the router to learn the models of backends that join while others leave.
SETTLE_TIMEOUT_S = 10.0

@dataclass(frozen=True, slots=True)
class Wanted:
    """One backend the set should hold: its name (a routing key), kind and URL, and the URL it was
    configured as (a ``--backend`` URL, or the ``--backend-dns`` URL it was found by: what the
    backend keys file names)."""

    name: str
    kind: BackendKind
    url: str
    configured_url: str


MakeBackend = Callable[[Wanted], Backend]


class DiscoveryError(Exception):
    """A name did not resolve to any address (the reason in the message)."""


class DnsResolver:
    """A/AAAA lookups through dnspython's asyncio resolver: the system's servers and search list,
    or one given server (``IP[:PORT]``)."""

    def __init__(self, server: str | None = None, *, timeout_s: float = RESOLVE_TIMEOUT_S) -> None:
        if server is None:
            try:
                self._resolver = dns.asyncresolver.Resolver(configure=True)
            except dns.exception.DNSException as exc:  # no /etc/resolv.conf, or one without a server
                raise ConfigError("--backend-dns-server", f"no DNS server configured on this host ({exc}): "
                                  "name one") from exc
        else:
            ip, port = dns_server_address(server)
            self._resolver = dns.asyncresolver.Resolver(configure=False)
            self._resolver.nameservers = [ip]
            self._resolver.port = port
        self._resolver.lifetime = timeout_s
        self._resolver.cache = None  # every round asks: a replica that left must leave

    async def addresses(self, host: str) -> list[str]:
        """Every A and AAAA address of ``host``, sorted; ``DiscoveryError`` when there is none."""
        try:
            return [str(ipaddress.ip_address(host))]  # an address needs no lookup
        except ValueError:
            pass
        answers = await asyncio.gather(*(self._lookup(host, rdtype) for rdtype in RECORD_TYPES),
                                       return_exceptions=True)
        found: set[str] = set()
        reasons: list[str] = []
        for rdtype, answer in zip(RECORD_TYPES, answers, strict=True):
            if isinstance(answer, asyncio.CancelledError):
                raise answer
            if isinstance(answer, BaseException):
                reasons.append(f"{rdtype}: {answer.__class__.__name__}")
            else:
                found.update(answer)
        if not found:
            raise DiscoveryError(f"{host} has no address ({'; '.join(reasons) or 'empty answer'})")
        return sorted(found, key=_address_order)

    async def _lookup(self, host: str, rdtype: str) -> list[str]:
        try:
            answer = await self._resolver.resolve(host, rdtype, search=True)
        except dns.resolver.NoAnswer:  # the name exists without records of this family
            return []
        except dns.exception.DNSException as exc:  # NXDOMAIN, timeout, no server answered
            raise DiscoveryError(f"{host} {rdtype}: {exc}") from exc
        return [rr.to_text() for rr in answer]


def discovered(spec: BackendSpec, address: str) -> Wanted:
    """The backend at ``address`` for a ``--backend-dns`` spec: its scheme and port, the address as
    the host; named by address and port, the same on every gateway."""
    parts = urlsplit(spec.url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = f"[{address}]" if ":" in address else address
    netloc = f"{host}:{port}"
    return Wanted(netloc, spec.kind, f"{parts.scheme}://{netloc}{parts.path}", spec.url)


def wanted_backends(
    static: Sequence[BackendSpec], dns_specs: Sequence[BackendSpec], answers: Sequence[Sequence[str]],
    max_backends: int, members: Collection[str] = (),
) -> tuple[list[Wanted], int]:
    """The set to hold: the static backends (named ``KIND-i`` by position unless named), then each
    DNS spec's addresses (``answers[i]`` for ``dns_specs[i]``); a URL already held is not added
    twice. Past ``max_backends``, discovered backends named in ``members`` (the set now serving)
    are kept before new ones. Returns the set and how many were left out."""
    wanted: list[Wanted] = []
    found: list[Wanted] = []
    urls: set[str] = set()
    for i, spec in enumerate(static):
        if spec.url not in urls:
            urls.add(spec.url)
            wanted.append(Wanted(spec.name or f"{spec.kind}-{i}", spec.kind, spec.url, spec.url))
    for spec, addresses in zip(dns_specs, answers, strict=True):
        for address in addresses:
            backend = discovered(spec, address)
            if backend.url not in urls:
                urls.add(backend.url)
                found.append(backend)
    room = max(0, max_backends - len(wanted))
    if len(found) > room:
        serving = [w for w in found if w.name in members]
        chosen = {w.name for w in [*serving, *(w for w in found if w.name not in members)][:room]}
        found = [w for w in found if w.name in chosen]  # in the answer's order, as every gateway has it
    wanted += found
    return wanted[:max_backends], max(0, len(urls) - max_backends)


class BackendDiscovery:
    """Holds the backend set and keeps it in step with the static list and the DNS names.

    ``make_backend(wanted)`` builds a backend; ``apply(backends)`` hands a changed set to
    the router. ``start()`` resolves every interval; ``set_static`` (a reload) replaces the static
    list and the backend keys' factory at once.
    """

    def __init__(
        self, static: Sequence[BackendSpec], dns_specs: Sequence[BackendSpec], make_backend: MakeBackend, *,
        resolver: DnsResolver | None = None, interval_s: float = 10.0, max_backends: int = 64,
        allowed: Sequence[IPNetwork] = (), registry: CollectorRegistry | None = None,
    ) -> None:
        self._static = tuple(static)
        self._dns = tuple(dns_specs)
        self._make = make_backend
        self._resolver = resolver if resolver is not None or not dns_specs else DnsResolver()
        self._interval_s = interval_s
        self._max = max_backends
        self._allowed = tuple(allowed)
        self._known: dict[BackendSpec, list[str]] = {}  # each name's last good answer
        self._refused: dict[BackendSpec, set[str]] = {}  # what each name's answers held and were refused
        self.backends: list[Backend] = []
        self._apply: Callable[[list[Backend]], object] | None = None
        self._settle: Callable[[], Awaitable[None]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self.failures = Counter("mmgate_backend_discovery_failures_total",
                                "Resolutions of a --backend-dns name that failed (the last known addresses kept)",
                                registry=registry)
        self.left_out = Counter("mmgate_backend_discovery_left_out_total",
                                "Backends a DNS answer named past --max-backends (left out)", registry=registry)
        self.count = Gauge("mmgate_backends", "Backends the gateway routes to (static and discovered)",
                           registry=registry)

    async def resolve(self) -> list[Backend]:
        """One round: resolve every name (fail static per name), build the set, and hand it to
        ``apply`` when it changed. Returns the set."""
        async with self._lock:
            answers = await asyncio.gather(*(self._answer(spec) for spec in self._dns))
            return await self._update(answers)

    async def set_static(
        self, static: Sequence[BackendSpec], make_backend: MakeBackend | None = None, *, rebuild: bool = False,
    ) -> list[Backend]:
        """Replace the static list (and the factory); backends whose name and URL stay are kept,
        unless ``rebuild`` (their keys changed): then every backend is built anew, under its
        old name. Returns the set."""
        async with self._lock:
            self._static = tuple(static)
            if make_backend is not None:
                self._make = make_backend
            return await self._update([self._known.get(spec, []) for spec in self._dns], rebuild=rebuild)

    def on_change(self, apply: Callable[[list[Backend]], object],
                  settle: Callable[[], Awaitable[None]] | None = None) -> None:
        """Call ``apply(backends)`` with each changed set from now on (``Router.set_backends``);
        ``settle()`` (``Router.refresh_models``) returns once the backends applied know their
        models: awaited before members that leave go, when others join."""
        self._apply = apply
        self._settle = settle

    async def _answer(self, spec: BackendSpec) -> list[str]:
        host = urlsplit(spec.url).hostname or ""
        assert self._resolver is not None
        try:
            addresses = self._admitted(spec, await self._resolver.addresses(host))
        except DiscoveryError as exc:
            # Fail static: DNS trouble (or a Service with no ready pod) never empties the fleet;
            # health probes eject the replicas that are really gone.
            self.failures.inc()
            known = self._known.get(spec, [])
            log.warning("backend discovery: %s; keeping its last %d address(es)", exc, len(known))
            return known
        self._known[spec] = addresses
        return addresses

    def _admitted(self, spec: BackendSpec, addresses: list[str]) -> list[str]:
        kept, refused = admitted(addresses, self._allowed)
        if set(refused) != self._refused.get(spec, set()):
            self._refused[spec] = set(refused)
            if refused:
                shown = ", ".join(f"{a} ({why})" for a, why in list(refused.items())[:8])
                log.warning("backend discovery: %s names %d special-purpose address(es), refused (open one with "
                            "--backend-dns-allowed if intended): %s", spec.url, len(refused), shown)
        if not kept:
            raise DiscoveryError(f"{spec.url} names no address a backend may have")
        return kept

    async def _update(self, answers: Sequence[Sequence[str]], *, rebuild: bool = False) -> list[Backend]:
        wanted, left_out = wanted_backends(self._static, self._dns, answers, self._max,
                                           members={b.name for b in self.backends})
        if left_out:
            self.left_out.inc(left_out)
            log.warning("backend discovery: %d backend(s) past --max-backends=%d left out", left_out, self._max)
        current = {} if rebuild else {(b.name, b.url): b for b in self.backends}
        backends = [current.get((w.name, w.url)) or self._make(w) for w in wanted]
        if not backends:
            return self.backends  # nothing known yet (start-up): the caller decides
        if [id(b) for b in backends] == [id(b) for b in self.backends]:
            return self.backends
        kept = {id(b) for b in backends}
        gone = [b for b in self.backends if id(b) not in kept]
        names = {b.name for b in self.backends}
        joined = [b.name for b in backends if b.name not in names]
        staying = {w.name for w in wanted}
        leaving = [b for b in self.backends if b.name not in staying]
        if self._apply is not None and self._settle is not None and joined and leaving:
            # The joiners serve beside the leavers until their models are known: no request meets
            # a set that cannot serve its model. Bounded: a joiner that does not answer is no reason
            # to keep a leaver.
            self._apply([*backends, *leaving])
            self.backends = [*backends, *leaving]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._settle(), SETTLE_TIMEOUT_S)
        if self._apply is not None:
            self._apply(backends)  # first: a set the router refuses is not taken either
        self.backends = backends
        self.count.set(len(backends))
        if self._apply is not None:
            left = [b.name for b in gone if b.name not in {w.name for w in wanted}]
            log.info("backends: %d (joined: %s; left: %s)", len(backends), ", ".join(joined) or "none",
                     ", ".join(left) or "none")
        return backends

    async def start(self) -> None:
        """Re-resolve every interval in the background (nothing to do without DNS names)."""
        if self._dns and self._task is None:
            self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.resolve()
            except Exception:
                # A failed round must never end the loop: the next one retries.
                log.exception("backend discovery round failed")

    async def close(self) -> None:
        """Stop resolving (the router closes the backends)."""
        tasks = [t for t in (self._task,) if t is not None]
        self._task = None
        await stop_tasks(tasks, STOP_WAIT_S)


async def first_backends(discovery: BackendDiscovery, *, timeout_s: float, sleep: Callable[[float], Awaitable[None]]
                         = asyncio.sleep) -> list[Backend]:
    """The first non-empty set, resolving again until ``timeout_s`` (replicas may be starting
    with the gateway); ``DiscoveryError`` past it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        backends = await discovery.resolve()
        if backends:
            return backends
        if loop.time() >= deadline:
            raise DiscoveryError(f"no backend found in {timeout_s:g} s (no --backend, and no --backend-dns "
                                 "name resolved to an address)")
        await sleep(min(1.0, max(0.0, deadline - loop.time())))


def _address_order(address: str) -> tuple[int, int]:
    """IPv4 before IPv6, each in numeric order: the same order on every gateway."""
    ip = ipaddress.ip_address(address)
    return ip.version, int(ip)
