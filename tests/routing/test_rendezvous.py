"""Rendezvous hashing: stable, minimal movement on removal, full restoration on return."""

from __future__ import annotations

import pytest

from mmgate.routing.scheduling.rendezvous import rendezvous_pick, rendezvous_rank, rendezvous_score

NODES = ["sim-0", "sim-1", "sim-2", "sim-3", "sim-4"]
KEYS = [f"session-{i}" for i in range(1000)]


def owners(nodes: list[str]) -> dict[str, str]:
    return {key: nodes[rendezvous_pick(key, nodes)] for key in KEYS}


def test_same_key_same_node_whatever_the_order() -> None:
    before = owners(NODES)
    assert owners(list(reversed(NODES))) == before
    assert owners(NODES) == before


def test_score_is_a_fixed_function() -> None:
    # Every gateway process must agree: no per-process salt (Python's hash() would have one).
    assert rendezvous_score("s", "n") == rendezvous_score("s", "n")
    assert rendezvous_score("s", "n") != rendezvous_score("n", "s")
    assert rendezvous_score("a", "bc") != rendezvous_score("ab", "c")


def test_keys_spread_over_every_node() -> None:
    counts = {node: 0 for node in NODES}
    for node in owners(NODES).values():
        counts[node] += 1
    # 200 expected each; a node with under 100 would mean a broken hash.
    assert min(counts.values()) > 100, counts


def test_removing_a_node_moves_only_its_keys_and_adding_it_back_restores() -> None:
    before = owners(NODES)
    removed = "sim-2"
    after = owners([n for n in NODES if n != removed])
    moved = {k for k in KEYS if before[k] != after[k]}
    held = {k for k in KEYS if before[k] == removed}
    assert moved == held
    assert held  # the removed node held some keys
    assert all(after[k] != removed for k in KEYS)
    assert owners(NODES) == before


def test_adding_a_node_moves_keys_only_to_it() -> None:
    before = owners(NODES)
    after = owners([*NODES, "sim-5"])
    assert all(after[k] == "sim-5" for k in KEYS if before[k] != after[k])


def test_rank_starts_with_pick_and_lists_every_node_once() -> None:
    for key in KEYS[:50]:
        rank = rendezvous_rank(key, NODES)
        assert rank[0] == rendezvous_pick(key, NODES)
        assert sorted(rank) == list(range(len(NODES)))


def test_rank_second_choice_is_the_winner_once_the_first_is_gone() -> None:
    for key in KEYS[:50]:
        rank = rendezvous_rank(key, NODES)
        rest = [NODES[i] for i in rank[1:]]
        assert rest[rendezvous_pick(key, rest)] == NODES[rank[1]]


def test_no_nodes_is_an_error() -> None:
    with pytest.raises(ValueError):
        rendezvous_pick("k", [])
    assert rendezvous_rank("k", []) == []


def test_one_node_ranks_first_without_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr("mmgate.routing.scheduling.rendezvous.rendezvous_score", lambda key, node: calls.append(node) or 0)
    assert rendezvous_rank("k", ["only"]) == [0] and calls == []
    assert rendezvous_rank("k", ["a", "b"]) in ([0, 1], [1, 0]) and calls == ["a", "b"]
