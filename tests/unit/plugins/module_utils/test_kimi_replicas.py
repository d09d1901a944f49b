"""Replica groups: how the inventory's kimi_replica_<name> groups become replicas, play patterns and batches."""

from __future__ import annotations

from ansible_collections.kimi.k2.plugins.module_utils import kimi_replicas

TWO = {
    "all": ["n1", "n2", "n3", "n4", "r1"],
    "kimi_nodes": ["n1", "n2", "n3", "n4"],
    "kimi_replica_b": ["n3", "n4"],
    "kimi_replica_a": ["n1", "n2"],
    "kimi_router": ["r1"],
}


def test_no_replica_groups_is_one_default_replica_of_every_node() -> None:
    groups = {"kimi_nodes": ["n1", "n2"]}
    assert kimi_replicas.replicas(groups) == {"default": ["n1", "n2"]}
    assert kimi_replicas.replica_of(groups, "n2") == "default"
    assert kimi_replicas.play_pattern(groups) == "kimi_nodes"
    assert kimi_replicas.play_batches(groups) == ["100%"]
    assert kimi_replicas.problems(groups) == []


def test_replica_groups_sorted_by_name_with_short_names() -> None:
    assert kimi_replicas.replicas(TWO) == {"a": ["n1", "n2"], "b": ["n3", "n4"]}
    assert kimi_replicas.replica_of(TWO, "n3") == "b"
    assert kimi_replicas.replica_of(TWO, "r1") is None
    assert kimi_replicas.play_pattern(TWO) == "kimi_replica_a,kimi_replica_b"
    assert kimi_replicas.play_batches(TWO) == [2, 2]


def test_batches_count_only_the_hosts_the_limit_kept() -> None:
    assert kimi_replicas.play_batches(TWO, ["n3", "n4"]) == [2]
    assert kimi_replicas.play_batches(TWO, ["n1", "n3", "n4"]) == [1, 2]
    assert kimi_replicas.play_batches(TWO, []) == ["100%"]


def test_a_node_in_two_replicas_is_refused_naming_both() -> None:
    groups = {**TWO, "kimi_replica_b": ["n2", "n3", "n4"]}
    (message,) = kimi_replicas.problems(groups)
    assert "n2 is in two replicas, kimi_replica_a and kimi_replica_b" in message


def test_a_node_in_no_replica_and_a_stranger_in_one_are_refused() -> None:
    groups = {**TWO, "kimi_nodes": [*TWO["kimi_nodes"], "n5"], "kimi_replica_a": ["n1", "n2", "r1"]}
    messages = kimi_replicas.problems(groups)
    assert any("r1 is in replica group kimi_replica_a but not in kimi_nodes" in m for m in messages)
    assert any(m.startswith("n5 in kimi_nodes but in no kimi_replica_<name> group") for m in messages)


def test_an_empty_replica_group_is_refused() -> None:
    messages = kimi_replicas.problems({**TWO, "kimi_replica_c": []})
    assert messages == ["inventory group kimi_replica_c has no hosts: give it its nodes or remove it"]
