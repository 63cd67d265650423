"""Free TCP ports for the servers tests and benchmarks start on loopback."""

from __future__ import annotations

import random
import socket


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_EPHEMERAL_LOW = _ephemeral_low()
_handed_out: set[int] = set()
_ports = random.Random()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free a moment ago on ``host`` and not handed out before by this process, from
    below the ephemeral range: port 0 would give one inside it, where every outgoing connection
    draws its source port, so between the pick and the server's bind a connection could take it
    ("address already in use" for a server started a moment later)."""
    low = 10000 if _EPHEMERAL_LOW > 11000 else 1024
    for _ in range(1000):
        port = _ports.randrange(low, _EPHEMERAL_LOW)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise OSError(f"no free TCP port on {host} in {low}..{_EPHEMERAL_LOW - 1}")
