"""Which addresses of a ``--backend-dns`` answer may become backends.

A DNS answer is not the operator's word: whoever can write the zone (or spoof an answer) would
otherwise point the gateway's requests, its tenants' prompts and images and its backend keys at any
address. Private addresses are what replicas have (a headless Service lists pod IPs), so they pass;
special-purpose ones do not: unspecified, loopback, link-local, multicast, broadcast and reserved,
unless ``--backend-dns-allowed`` opens them (a test fleet on loopback), and cloud metadata
endpoints never. The classification reuses the URL policy's tables (``mmgate.media.addresses``):
addresses that embed an IPv4 address (IPv4-mapped, NAT64, 6to4) are judged by what they embed.
Pure functions, no sockets.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from mmgate.media.addresses import METADATA_ADDRESSES, IPAddress, IPNetwork, embedded_ipv4

CLOUD_METADATA = "cloud metadata"
_THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")
_BROADCAST = ipaddress.IPv4Address("255.255.255.255")


def special_purpose(ip: IPAddress) -> str | None:
    """Why ``ip`` is no address a replica serves at, or None when it may be one."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = ip.ipv4_mapped or embedded_ipv4(ip)
        if inner is not None:
            why = special_purpose(inner)
            return None if why is None else f"{why} (embeds {inner})"
    if ip in METADATA_ADDRESSES:
        return CLOUD_METADATA
    if ip.is_unspecified or ip in _THIS_NETWORK:
        return "unspecified"
    if ip == _BROADCAST:
        return "broadcast"
    for flag in ("loopback", "link_local", "multicast", "reserved"):
        if getattr(ip, f"is_{flag}"):
            return flag.replace("_", "-")
    return None


def refusal(ip: IPAddress, allowed: Sequence[IPNetwork]) -> str | None:
    """Why ``ip`` may not be a backend, given the networks an operator opened (metadata: never)."""
    why = special_purpose(ip)
    if why is None or (not why.startswith(CLOUD_METADATA) and any(ip in net for net in allowed)):
        return None
    return why


def admitted(addresses: Sequence[str], allowed: Sequence[IPNetwork]) -> tuple[list[str], dict[str, str]]:
    """The addresses that may be backends, in their order, and the refused ones with the reason."""
    kept: list[str] = []
    refused: dict[str, str] = {}
    for address in addresses:
        why = refusal(ipaddress.ip_address(address), allowed)
        if why is None:
            kept.append(address)
        else:
            refused[address] = why
    return kept, refused
