"""The checkpoint's spread over the cluster network: the doubling schedule and each node's sources."""

from __future__ import annotations

import math

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_checkpoint_peers as peers

NODES = [f"node{i}" for i in range(1, 17)]


def test_sixteen_nodes_take_four_rounds_after_the_seed_and_every_node_fetches_once():
    plan = peers.schedule(NODES)
    assert [f.host for f in plan] == NODES[1:]
    assert peers.plan(NODES)["rounds"] == 4 == math.ceil(math.log2(16))
    assert [sum(1 for f in plan if f.round == r) for r in (1, 2, 3, 4)] == [1, 2, 4, 8]


def test_each_fetcher_lists_every_holder_and_each_holder_is_first_for_one_new_node_per_round():
    plan = peers.schedule(NODES)
    holders = ["node1"]
    for round_number in (1, 2, 3, 4):
        fetching = [f for f in plan if f.round == round_number]
        for fetch in fetching:
            assert sorted(fetch.sources) == sorted(holders), fetch
        assert sorted(f.sources[0] for f in fetching) == sorted(holders)
        holders += [f.host for f in fetching]


def test_a_named_seed_goes_first_and_a_last_round_may_be_partial():
    plan = peers.schedule(["a", "b", "c", "d", "e"], seed="c")
    assert [(f.host, f.round, f.sources) for f in plan] == [
        ("a", 1, ("c",)),
        ("b", 2, ("c", "a")),
        ("d", 2, ("a", "c")),
        ("e", 3, ("c", "a", "b", "d")),
    ]
    assert peers.plan(["only"]) == {"seed": "only", "rounds": 0, "fetch": {}}


def test_nodes_that_hold_it_already_serve_a_new_replica_and_nobody_downloads_from_the_hub():
    # Two nodes of a running replica, two of a new one: one round, each new node with its own holder first.
    result = peers.plan(["r1n1", "r1n2", "r2n1", "r2n2"], holders=["r1n1", "r1n2"], seed="r2n1")
    assert result == {
        "seed": None,
        "rounds": 1,
        "fetch": {"r2n1": {"round": 1, "sources": ["r1n1", "r1n2"]}, "r2n2": {"round": 1, "sources": ["r1n2", "r1n1"]}},
    }
    assert peers.plan(["a", "b"], holders=["a", "b"]) == {"seed": None, "rounds": 0, "fetch": {}}


def test_a_seed_outside_the_nodes_is_refused_naming_the_variable():
    with pytest.raises(peers.PeerPlanError, match=r"checkpoint_seed_host is 'node9', which is not one of the nodes"):
        peers.plan(["node1", "node2"], seed="node9")
    with pytest.raises(peers.PeerPlanError, match="no node fetches"):
        peers.plan([])


def test_source_urls_are_the_holders_cluster_addresses_on_the_peer_port():
    addresses = {"node1": "10.0.0.1", "node2": "fd00::2"}
    assert peers.source_urls(["node2", "node1"], addresses, 29700) == [
        "http://[fd00::2]:29700/",
        "http://10.0.0.1:29700/",
    ]
    with pytest.raises(peers.PeerPlanError, match="node3: kimi_cluster_address is empty"):
        peers.source_urls(["node3"], addresses, 29700)


def test_peer_files_keep_sizes_and_checksums_and_list_one_url_per_source_in_order():
    files = [
        {"path": "model-00001-of-00002.safetensors", "size": 5, "sha256": "ab" * 32, "url": "http://mirror/x"},
        {"path": "sub dir/config.json", "size": 2, "git_oid": "cd" * 20},
    ]
    listed = peers.peer_files(files, ["http://10.0.0.2:29700/", "http://10.0.0.1:29700/"])
    assert listed == [
        {
            "path": "model-00001-of-00002.safetensors",
            "size": 5,
            "sha256": "ab" * 32,
            "urls": [
                "http://10.0.0.2:29700/model-00001-of-00002.safetensors",
                "http://10.0.0.1:29700/model-00001-of-00002.safetensors",
            ],
        },
        {
            "path": "sub dir/config.json",
            "size": 2,
            "git_oid": "cd" * 20,
            "urls": ["http://10.0.0.2:29700/sub%20dir/config.json", "http://10.0.0.1:29700/sub%20dir/config.json"],
        },
    ]
    with pytest.raises(peers.PeerPlanError, match="at least one source"):
        peers.peer_files(files, [])
