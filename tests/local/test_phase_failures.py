"""A node that fails a phase stops the later phases of its group with one message, and nothing runs on the
healthy node (roles/kimi/tasks/main.yml with plugins/callback/kimi_phase_failures.py), on local hosts."""

from __future__ import annotations

import sys

import yaml

from tests.ansible_run import REPO_ROOT, run_playbook

PLAYBOOK = REPO_ROOT / "tests" / "fixtures" / "phase_failures" / "playbook.yml"
STOP = "Stop this phase when a node of the group failed an earlier phase of this run"


def inventory(tmp_path):
    cluster = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "kimi_gpus_per_node": 8,
        "kimi_tensor_parallel_size": 8,
        "kimi_pipeline_parallel_size": 2,
        "kimi_enable_expert_parallel": True,
        "kimi_report_dir": str(tmp_path / "reports"),
        "phase_failures_marker_dir": str(tmp_path),
    }
    hosts = {"all": {"children": {"kimi_nodes": {"hosts": {"gn-a": {}, "gn-b": {}}, "vars": cluster}}}}
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(hosts))
    return path


def test_a_failed_node_stops_the_next_phase_with_one_message_and_nothing_runs_on_the_other(tmp_path):
    result = run_playbook(PLAYBOOK, inventory(tmp_path), timeout=300)
    assert result.rc != 0
    stops = [f for f in result.failures if f["task"] == STOP]
    assert len(stops) == 1, result.failure_messages()
    assert stops[0]["msg"] == (
        "gn-b failed in the checkpoint phase at 'Fetch the checkpoint (fails on the second node)': hf download "
        "exited 3 on gn-b; the serve phase needs every node of the group, so it stops here and changes nothing "
        "on gn-a. Mend gn-b and run again."
    )
    assert not list(tmp_path.glob("*.restarted")), "the serve phase ran on the healthy node"


def test_a_host_left_out_with_limit_is_not_a_failure(tmp_path):
    result = run_playbook(PLAYBOOK, inventory(tmp_path), limit="gn-a", timeout=300)
    assert result.rc == 0, result.failure_messages()
    assert [p.name for p in tmp_path.glob("*.restarted")] == ["gn-a.restarted"]
