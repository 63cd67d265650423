"""Address classification for the URL policy: which IPs an image fetch may reach.

Pure functions, no sockets. The tables are explicit (not ``ipaddress``'s ``is_private`` alone,
whose lists change between Python versions) and the ``ipaddress`` flags are kept as a second net.
Addresses that embed an IPv4 address (IPv4-mapped, NAT64, 6to4) are judged by what they embed.
"""

from __future__ import annotations

import ipaddress
import re

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Cloud metadata and platform endpoints: refused always, even inside an allowed CIDR.
METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, Oracle …
        "169.254.170.2",  # AWS ECS task metadata
        "169.254.169.253",  # AWS VPC DNS
        "169.254.169.123",  # AWS time sync
        "100.100.100.200",  # Alibaba Cloud
        "168.63.129.16",  # Azure wire server (a public address, reachable only inside Azure)
        "fd00:ec2::254",  # AWS IMDS over IPv6
        "fd00:ec2::23",  # AWS DNS over IPv6
    )
)
METADATA_HOSTNAMES: frozenset[str] = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "metadata.azure.internal",
        "instance-data",
        "instance-data.ec2.internal",
    }
)

_V4_BLOCKED: tuple[tuple[ipaddress.IPv4Network, str], ...] = tuple(
    (ipaddress.IPv4Network(net), why)
    for net, why in (
        ("0.0.0.0/8", "unspecified ('this network')"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "carrier-grade NAT (shared)"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "IETF protocol assignment"),
        ("192.0.2.0/24", "documentation"),
        ("192.88.99.0/24", "6to4 relay anycast"),
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "benchmarking"),
        ("198.51.100.0/24", "documentation"),
        ("203.0.113.0/24", "documentation"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved"),
    )
)

_V6_BLOCKED: tuple[tuple[ipaddress.IPv6Network, str], ...] = tuple(
    (ipaddress.IPv6Network(net), why)
    for net, why in (
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("::/96", "IPv4-compatible (deprecated)"),
        ("64:ff9b:1::/48", "local-use NAT64"),
        ("100::/64", "discard-only"),
        ("2001::/23", "IETF protocol assignment (Teredo, ORCHID …)"),
        ("2001:db8::/32", "documentation"),
        ("3fff::/20", "documentation"),
        ("5f00::/16", "segment-routing"),
        ("fc00::/7", "unique-local (private)"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local (deprecated)"),
        ("ff00::/8", "multicast"),
    )
)

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")

_LEGACY_PART = re.compile(r"0[xX][0-9a-fA-F]*|0[0-7]*|[1-9][0-9]*")


def blocked_reason(ip: IPAddress) -> str | None:
    """Why ``ip`` is not a public destination, or None when it is (ignores any allow-list)."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return blocked_reason(ip.ipv4_mapped)
        embedded = embedded_ipv4(ip)
        if embedded is not None:
            why = blocked_reason(embedded)
            return None if why is None else f"{why} (embeds {embedded})"
        table: tuple[tuple[IPNetwork, str], ...] = _V6_BLOCKED
    else:
        table = _V4_BLOCKED
    for net, why in table:
        if ip in net:
            return why
    # Second net: whatever this Python's ipaddress knows that the tables above do not.
    for flag, why in (
        ("is_unspecified", "unspecified"),
        ("is_loopback", "loopback"),
        ("is_link_local", "link-local"),
        ("is_multicast", "multicast"),
        ("is_reserved", "reserved"),
        ("is_private", "private"),
    ):
        if getattr(ip, flag):
            return why
    return None


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 destination a NAT64 (64:ff9b::/96) or 6to4 (2002::/16) address stands for."""
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.sixtofour


def parse_legacy_ipv4(text: str) -> ipaddress.IPv4Address | None:
    """The address ``inet_aton`` (and so ``getaddrinfo``) reads in ``text``, or None if it is a name.

    Accepts the forms C libraries accept: 1 to 4 dot-separated parts, each decimal, ``0x`` hex or
    ``0``-prefixed octal, the last part filling the remaining bytes (``127.1``, ``2130706433``,
    ``0x7f000001``, ``0177.0.0.1``). Numeric text out of range raises ``ValueError``.
    """
    parts = text.split(".")
    if not 1 <= len(parts) <= 4 or not all(_LEGACY_PART.fullmatch(p) for p in parts):
        return None
    values = []
    for part in parts:
        if part[:2].lower() == "0x":
            values.append(int(part[2:] or "0", 16))
        elif part.startswith("0"):
            values.append(int(part, 8))
        else:
            values.append(int(part))
    *head, last = values
    if any(v > 0xFF for v in head) or last >= 1 << (8 * (4 - len(head))):
        raise ValueError(f"{text!r} is numeric but out of range for an IPv4 address")
    number = last
    for i, v in enumerate(head):
        number |= v << (8 * (3 - i))
    return ipaddress.IPv4Address(number)
