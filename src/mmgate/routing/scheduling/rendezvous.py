"""Rendezvous (highest-random-weight) hashing: every gateway process picks the same node for a key
without coordination, and removing a node moves only the keys that node held (they come back when
it returns)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def rendezvous_score(key: str, node: str) -> int:
    """A stable 64-bit score of (key, node), the same in every process and on every run."""
    digest = hashlib.blake2b(f"{node}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous_pick(key: str, nodes: Sequence[str]) -> int:
    """Index of the node with the highest score for ``key`` (the first of equal ones); ``nodes``
    must not be empty."""
    if not nodes:
        raise ValueError("rendezvous_pick needs at least one node")
    return max(range(len(nodes)), key=lambda i: rendezvous_score(key, nodes[i]))


def rendezvous_rank(key: str, nodes: Sequence[str]) -> list[int]:
    """Indexes of ``nodes`` from most to least preferred for ``key`` (first == ``rendezvous_pick``).

    Ties (two nodes of the same name) keep their input order.
    """
    if len(nodes) < 2:
        return list(range(len(nodes)))  # nothing to rank: no hashing on a one-replica fleet's every request
    return sorted(range(len(nodes)), key=lambda i: -rendezvous_score(key, nodes[i]))
