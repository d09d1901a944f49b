"""playbooks/evidence.yml end to end on this host through ansible-runner: two "nodes" with a local connection, each
with its own evidence directory holding incidents written by the watchdog's own kimi_evidence.capture (its
commands answered by stand-ins, its files real), collected into a temporary report directory.

This machine has no systemd journal, so the journal window's file says why it is empty; the lab's heal test
(tests/lab/test_site_then_heal.py) collects real incidents and journals from real nodes.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ansible_run import REPO_ROOT, PlayResult, run_playbook
from tests.node_programs import watchdog

watchdog()  # kimi_evidence.py, importable as on a node
from kimi_evidence import Request, Tools, capture  # noqa: E402

EVIDENCE = REPO_ROOT / "playbooks" / "evidence.yml"
WALL = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def stand_in(argv, timeout) -> tuple[int, str, str, bool]:
    """The node's commands as a capture sees them: no such cgroup, one journal line, no sockets."""
    if argv[:2] == ["systemctl", "show"]:
        return 0, "\n", "", False
    return 0, f"{' '.join(argv[:3])}: one line\n", "", False


def write_incident(directory: Path, reason: str, minutes: int) -> str:
    tools = Tools(run=stand_in, wall=lambda: WALL + 60 * minutes, hostname=lambda: "node", which=lambda name: None)
    result = capture(Request(str(directory), "kimi-vllm.service", reason, "why", units=("kimi-vllm.service",)), tools)
    return Path(result.path).name


class Cluster:
    def __init__(self, tmp_path: Path) -> None:
        self.reports = tmp_path / "reports"
        self.inventory = tmp_path / "inventory.yml"
        self.evidence = {node: tmp_path / node / "evidence" for node in ("node1", "node2")}
        self.incidents = {
            "node1": [
                write_incident(self.evidence["node1"], r, m)
                for r, m in (("rank0_stalled", 0), ("rank0_stalled", 5), ("rank0_never_served", 9))
            ],
            "node2": [],
        }
        self.evidence["node2"].mkdir(parents=True)
        # Not an incident: left alone.
        (self.evidence["node1"] / "notes").mkdir()
        hosts = {node: {"kimi_evidence_dir": str(path)} for node, path in self.evidence.items()}
        group_vars = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "ansible_become": False,
            "kimi_gpus_per_node": 1,
            "kimi_tensor_parallel_size": 1,
            "kimi_pipeline_parallel_size": 2,
            "kimi_report_dir": str(self.reports),
        }
        self.inventory.write_text(yaml.safe_dump({"kimi_nodes": {"hosts": hosts, "vars": group_vars}}))

    def collect(self, check: bool = False, **extravars: Any) -> PlayResult:
        return run_playbook(EVIDENCE, self.inventory, extravars=extravars, check=check, timeout=300)


@pytest.fixture
def cluster(tmp_path) -> Cluster:
    return Cluster(tmp_path)


# The tasks that write on the controller (delegated to localhost).
CONTROLLER_TASKS = {
    "Create this node's directory on the controller",
    "Write the journal window on the controller",
    "Fetch the archive",
    "Unpack it beside the journal window",
    "Remove the fetched archive on the controller",
    "Write the summary on the controller",
}


def changed_tasks(result: PlayResult) -> set[str]:
    return {
        event["event_data"]["task"]
        for event in result.events
        if event.get("event") == "runner_on_ok" and event["event_data"].get("res", {}).get("changed")
    }


def leftover_archives() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("*.kimi-evidence.tar.gz")}


def test_the_newest_incidents_of_every_node_land_on_the_controller_and_nothing_changes_on_the_nodes(cluster):
    before = leftover_archives()
    result = cluster.collect(evidence_last="2")
    assert result.rc == 0, result.failure_messages()
    # What changed is the controller's copy; every task on the nodes themselves only read (the archive is made and
    # removed, reported unchanged).
    assert changed_tasks(result) <= CONTROLLER_TASKS, changed_tasks(result)
    [run] = (cluster.reports / "evidence").iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert [i["incident"] for i in summary["nodes"]["node1"]] == cluster.incidents["node1"][1:]
    assert summary["nodes"]["node2"] == []
    node1 = run / "default" / "node1"
    assert sorted(p.name for p in node1.iterdir()) == sorted([*cluster.incidents["node1"][1:], "journal-window.txt"])
    newest = node1 / cluster.incidents["node1"][-1]
    assert json.loads((newest / "incident.json").read_text())["reason"] == "rank0_never_served"
    assert (newest / "journal-kimi-vllm.service.txt").read_text() == "journalctl -u kimi-vllm.service: one line\n"
    # Each node's journal window (this host has no journal: the file says so rather than being missing).
    for node in ("node1", "node2"):
        assert (run / "default" / node / "journal-window.txt").read_text().strip()
    # The incidents stay on the nodes; no archive is left behind.
    assert sorted(p.name for p in cluster.evidence["node1"].iterdir()) == sorted([*cluster.incidents["node1"], "notes"])
    assert leftover_archives() == before


def test_check_mode_reads_the_nodes_and_writes_nothing(cluster):
    result = cluster.collect(check=True)
    assert result.rc == 0, result.failure_messages()
    assert not (cluster.reports / "evidence").exists()
    messages = [str(r.get("msg")) for r in result.results_of("Show the incidents per node").values()]
    assert any("--check: nothing written" in m and cluster.incidents["node1"][-1] in m for m in messages), messages


@pytest.mark.parametrize(("value", "words"), [("0", "evidence_last (0)"), ("many", "evidence_last")])
def test_a_count_that_collects_nothing_is_refused_by_name_before_any_node_is_read(cluster, value, words):
    result = cluster.collect(evidence_last=value)
    assert result.rc != 0
    assert any(words in message for message in result.failure_messages()), result.failure_messages()
    assert not (cluster.reports / "evidence").exists()
    assert not result.results_of("Find the incidents the watchdog kept on this node")
