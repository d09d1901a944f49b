"""The preflight inventory check, run for real through ansible-runner against local-connection hosts."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.ansible_run import REPO_ROOT, run_playbook

PREFLIGHT = REPO_ROOT / "playbooks" / "preflight.yml"
INVENTORY_CHECK = "Resolve node ranks from inventory order and check the layout covers the replica's nodes"
REPLICA_CHECK = "Refuse replica groups that do not split the nodes into separate groups"


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
    answer = topology["a-node"]
    assert topology["b-node"] == answer  # every host resolves its replica, and both agree
    assert answer["node_ranks"] == {"b-node": 0, "a-node": 1}
    assert answer["master_host"] == "b-node"
    assert result.changed == 0


def test_rank_override_moves_the_master(tmp_path):
    result = run_check(tmp_path, {"n1": {"kimi_node_rank": 1}, "n2": {"kimi_node_rank": 0}})
    assert result.rc == 0, result.failure_messages()
    assert {answer["master_host"] for answer in result.results_of(INVENTORY_CHECK).values()} == {"n2"}


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


def write_replicas_inventory(tmp_path: Path, replicas: dict[str, dict], **cluster) -> Path:
    """Two replica groups under kimi_nodes, each with its own layout vars (greennode's by default)."""
    path = write_inventory(tmp_path, {}, **cluster)
    inventory = yaml.safe_load(path.read_text())
    nodes = inventory["all"]["children"]["kimi_nodes"]
    nodes["children"] = {f"kimi_replica_{name}": group for name, group in replicas.items()}
    path.write_text(yaml.safe_dump(inventory, sort_keys=False))
    return path


def test_each_replica_has_its_own_layout_ranks_and_master(tmp_path):
    replicas = {
        "a": {"hosts": {"a1": {}, "a2": {}}},
        # Replica b: one node, TP8 alone (its own layout, from its group's vars).
        "b": {"hosts": {"b1": {}}, "vars": {"kimi_pipeline_parallel_size": 1}},
    }
    inventory = write_replicas_inventory(tmp_path, replicas)
    result = run_playbook(PREFLIGHT, inventory, tags="always", timeout=300)
    assert result.rc == 0, result.failure_messages()
    topology = result.results_of(INVENTORY_CHECK)
    assert topology["a2"]["node_ranks"] == {"a1": 0, "a2": 1}
    assert topology["a2"]["master_host"] == "a1"
    assert topology["b1"]["node_ranks"] == {"b1": 0}
    assert topology["b1"]["master_host"] == "b1"


def test_a_node_in_two_replicas_is_refused_before_anything_runs(tmp_path):
    replicas = {"a": {"hosts": {"n1": {}, "n2": {}}}, "b": {"hosts": {"n2": {}, "n3": {}}}}
    inventory = write_replicas_inventory(tmp_path, replicas)
    result = run_playbook(PREFLIGHT, inventory, tags="always", timeout=300)
    assert result.rc != 0
    assert any("n2 is in two replicas, kimi_replica_a and kimi_replica_b" in f["msg"] for f in result.failures)
    assert all(f["task"] == REPLICA_CHECK for f in result.failures), result.failure_messages()
