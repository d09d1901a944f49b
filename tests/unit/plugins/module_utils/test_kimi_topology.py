from __future__ import annotations

import pytest
from ansible_collections.kimi.k2.plugins.module_utils.kimi_topology import (
    Layout,
    TopologyError,
    build_layout,
    layout_problems,
    resolve_node_ranks,
    resolve_topology,
)

HOSTS = ["gn-node1", "gn-node2"]


def test_ranks_follow_inventory_order():
    assert resolve_node_ranks(HOSTS, {}) == {"gn-node1": 0, "gn-node2": 1}


def test_overrides_swap_the_master():
    ranks = resolve_node_ranks(HOSTS, {"gn-node1": 1, "gn-node2": "0"})
    assert ranks == {"gn-node1": 1, "gn-node2": 0}


def test_duplicate_rank_names_both_hosts_and_the_missing_rank():
    with pytest.raises(TopologyError, match=r"rank 0: gn-node1, gn-node2.*rank\(s\) 1 have no host"):
        resolve_node_ranks(HOSTS, {"gn-node2": 0})


def test_rank_out_of_range_names_host_and_range():
    with pytest.raises(TopologyError, match=r"kimi_node_rank=2 on host gn-node2 .* ranks 0..1"):
        resolve_node_ranks(HOSTS, {"gn-node2": 2})


@pytest.mark.parametrize("value", ["one", 1.5, True, None])
def test_rank_must_be_an_integer(value):
    with pytest.raises(TopologyError, match="kimi_node_rank on host gn-node1 must be an integer"):
        resolve_node_ranks(HOSTS, {"gn-node1": value})


def test_override_for_unknown_host_is_refused():
    with pytest.raises(TopologyError, match="not in kimi_nodes: ghost"):
        resolve_node_ranks(HOSTS, {"ghost": 0})


def test_empty_group_is_refused():
    with pytest.raises(TopologyError, match="kimi_nodes is empty"):
        resolve_node_ranks([], {})


def test_host_listed_twice_is_refused():
    with pytest.raises(TopologyError, match="listed twice"):
        resolve_node_ranks(["a", "a"], {})


def test_greennode_layout_fits_two_nodes_of_eight():
    topology = resolve_topology(HOSTS, {}, 8, {"tensor_parallel_size": 8, "pipeline_parallel_size": 2})
    assert topology.problems == []
    assert topology.master_host == "gn-node1"
    assert topology.as_dict()["world_size"] == 16


def test_layout_that_does_not_cover_the_nodes_names_all_numbers():
    problems = layout_problems(Layout(tensor_parallel_size=8, pipeline_parallel_size=1), 2, 8)
    assert problems == [
        "layout needs 8 GPUs (kimi_tensor_parallel_size 8 x kimi_pipeline_parallel_size 1 x "
        "kimi_data_parallel_size 1) but kimi_nodes has 2 node(s) x kimi_gpus_per_node 8 = 16"
    ]


def test_dcp_must_divide_tp():
    with pytest.raises(TopologyError, match="kimi_decode_context_parallel_size=3 must divide"):
        build_layout({"tensor_parallel_size": 8, "decode_context_parallel_size": 3})


def test_zero_sizes_are_refused_with_the_variable_name():
    with pytest.raises(TopologyError, match="kimi_pipeline_parallel_size must be at least 1"):
        build_layout({"tensor_parallel_size": 8, "pipeline_parallel_size": 0})
    with pytest.raises(TopologyError, match="kimi_gpus_per_node must be at least 1"):
        resolve_topology(HOSTS, {}, 0, {"tensor_parallel_size": 1})


def test_expert_parallel_must_be_boolean():
    with pytest.raises(TopologyError, match="kimi_enable_expert_parallel must be true or false"):
        build_layout({"tensor_parallel_size": 8, "enable_expert_parallel": "yes"})
