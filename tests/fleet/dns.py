"""A real DNS server on loopback (dnslib's UDP/TCP server in a thread) whose A/AAAA records a test
changes while gateways resolve through it; ``failing`` makes it answer SERVFAIL to everything."""

from __future__ import annotations

import contextlib
import ipaddress
import threading
from collections.abc import Iterator
from typing import Any

from dnslib import AAAA, QTYPE, RCODE, RR, A
from dnslib.server import BaseResolver, DNSLogger, DNSServer

from tests.support.ports import free_port


class Records(BaseResolver):
    """Name → addresses, changed by the test; every answer has a 1 s TTL."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: dict[str, list[str]] = {}
        self.failing = False
        self.queries = 0

    def set(self, name: str, addresses: list[str]) -> None:
        with self._lock:
            self._names[name.rstrip(".").lower()] = list(addresses)

    def resolve(self, request: Any, handler: Any) -> Any:
        reply = request.reply()
        with self._lock:
            self.queries += 1
            if self.failing:
                reply.header.rcode = RCODE.SERVFAIL
                return reply
            name = str(request.q.qname).rstrip(".").lower()
            addresses = self._names.get(name)
        if addresses is None:
            reply.header.rcode = RCODE.NXDOMAIN
            return reply
        qtype = QTYPE[request.q.qtype]
        for address in addresses:
            version = ipaddress.ip_address(address).version
            if qtype == "A" and version == 4:
                reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(address), ttl=1))
            elif qtype == "AAAA" and version == 6:
                reply.add_answer(RR(request.q.qname, QTYPE.AAAA, rdata=AAAA(address), ttl=1))
        return reply


@contextlib.contextmanager
def loopback_dns() -> Iterator[tuple[Records, str]]:
    """A DNS server on 127.0.0.1; yields its records and its ``IP:PORT`` (``--backend-dns-server``)."""
    records = Records()
    port = free_port()
    quiet = DNSLogger(logf=lambda _: None)
    servers = [DNSServer(records, port=port, address="127.0.0.1", logger=quiet, tcp=tcp) for tcp in (False, True)]
    for server in servers:
        server.start_thread()
    try:
        yield records, f"127.0.0.1:{port}"
    finally:
        for server in servers:
            server.stop()
