"""The `kimi.k2.checkpoint_*` filters: the plan and the lists as the role reads them, refusals as filter errors."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.kimi.k2.plugins.filter import kimi_checkpoint


def test_the_filters_are_registered_under_their_names():
    assert set(kimi_checkpoint.FilterModule().filters()) == {
        "checkpoint_spread",
        "checkpoint_peer_urls",
        "checkpoint_peer_files",
    }


def test_spread_plans_from_the_play_hosts_and_refuses_a_seed_outside_them():
    assert kimi_checkpoint.checkpoint_spread(["n1", "n2", "n3"], [], "")["fetch"] == {
        "n2": {"round": 1, "sources": ["n1"]},
        "n3": {"round": 2, "sources": ["n1", "n2"]},
    }
    with pytest.raises(AnsibleFilterError, match="checkpoint_seed_host is 'n9'"):
        kimi_checkpoint.checkpoint_spread(["n1", "n2"], [], "n9")


def test_urls_take_the_port_as_inventory_text_and_name_a_node_without_an_address():
    assert kimi_checkpoint.checkpoint_peer_urls(["n1"], {"n1": "198.18.0.11"}, "29700") == ["http://198.18.0.11:29700/"]
    with pytest.raises(AnsibleFilterError, match="n2: kimi_cluster_address is empty"):
        kimi_checkpoint.checkpoint_peer_urls(["n2"], {"n2": ""}, 29700)
    with pytest.raises(AnsibleFilterError, match="at least one source"):
        kimi_checkpoint.checkpoint_peer_files([{"path": "a", "size": 1}], [])
