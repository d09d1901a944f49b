"""The preflight inventory check, run for real through ansible-runner against local-connection hosts."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.ansible_run import REPO_ROOT, run_playbook

PREFLIGHT = REPO_ROOT / "playbooks" / "preflight.yml"
INVENTORY_CHECK = "Resolve node ranks from inventory order and check the layout covers the nodes"


def write_inventory(tmp_path: Path, hosts: dict[str, dict], **cluster) -> Path:
    """A two-level inventory whose hosts all run locally, with the greennode layout unless overridden."""
    layout = {
        "kimi_gpus_per_node": 8,
        "kimi_tensor_parallel_size": 8,
        "kimi_pipeline_parallel_size": 2,
        "kimi_data_parallel_size": 1,
        "kimi_decode_context_parallel_size": 1,
        "kimi_enable_expert_parallel": True,
        "ansible_connection": "local",
        "ansible_python_interpreter": str(REPO_ROOT / ".venv" / "bin" / "python"),
    }
    layout.update(cluster)
    inventory = {"all": {"children": {"kimi_nodes": {"hosts": hosts, "vars": layout}}}}
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(inventory, sort_keys=False))
    return path


def run_check(tmp_path: Path, hosts: dict[str, dict], **cluster):
    inventory = write_inventory(tmp_path, hosts, **cluster)
    return run_playbook(PREFLIGHT, inventory, tags="always", timeout=300)


def test_ranks_follow_inventory_order(tmp_path):
    result = run_check(tmp_path, {"b-node": {}, "a-node": {}})
    assert result.rc == 0, result.failure_messages()
    topology = result.results_of(INVENTORY_CHECK)
    (answer,) = topology.values()
    assert answer["node_ranks"] == {"b-node": 0, "a-node": 1}
    assert answer["master_host"] == "b-node"
    assert result.changed == 0


def test_rank_override_moves_the_master(tmp_path):
    result = run_check(tmp_path, {"n1": {"kimi_node_rank": 1}, "n2": {"kimi_node_rank": 0}})
    assert result.rc == 0, result.failure_messages()
    (answer,) = result.results_of(INVENTORY_CHECK).values()
    assert answer["master_host"] == "n2"


@pytest.mark.parametrize(
    ("hosts", "cluster", "message"),
    [
        ({"n1": {"kimi_node_rank": 0}, "n2": {"kimi_node_rank": 0}}, {}, "duplicate kimi_node_rank"),
        ({"n1": {}, "n2": {"kimi_node_rank": 5}}, {}, "kimi_node_rank=5 on host n2 is out of range"),
        ({"n1": {}, "n2": {}}, {"kimi_pipeline_parallel_size": 1}, "layout needs 8 GPUs"),
        ({"n1": {}, "n2": {}}, {"kimi_decode_context_parallel_size": 3}, "must divide"),
    ],
)
def test_bad_inventory_stops_the_play_with_a_named_reason(tmp_path, hosts, cluster, message):
    result = run_check(tmp_path, hosts, **cluster)
    assert result.rc != 0
    assert result.failures, "the play failed without a failing task"
    assert any(message in f["msg"] for f in result.failures), result.failure_messages()
    assert all(f["task"] == INVENTORY_CHECK for f in result.failures)
