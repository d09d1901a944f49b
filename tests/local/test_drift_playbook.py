"""playbooks/drift.yml end to end on this host through ansible-runner: one node with a local connection whose
"stack and serve phases" are tests/fixtures/drift/converge.yml (files under a temporary directory), a
checkpoint marker, and /health answered by this test's own HTTP server (a thread, stopped at the end).

The node's units are not checked here (this machine has no systemd: tests/unit covers systemctl's output);
everything else runs for real: the nested check-mode ansible-playbook with the callback, parity over the
node's real stack facts, the marker read, /health asked from the node, the report module, the exit status.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.kimi.k2.plugins.module_utils import kimi_checkpoint as ck

from tests.ansible_run import REPO_ROOT, PlayResult, run_playbook

# Tier 2 (tests/tiers.py, group local-slow): make test-all, and CI while its time allows, or when its code changed.
pytestmark = pytest.mark.tier2("local-slow")

DRIFT = REPO_ROOT / "playbooks" / "drift.yml"
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "drift"
REPO_ID = "kimi-lab/Kimi-K2-mini"
SHA = "60877af7bde655c71406a1843bcc395afa52fb57"
OLD_KEY = "drift-e2e-old-key-93b1"
NEW_KEY = "drift-e2e-new-key-1c77"
CHECKPOINT_FILES = {"config.json": b'{"num_hidden_layers": 2}\n', "model.safetensors": bytes(range(256)) * 64}


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        code = 200 if self.path == "/health" else 404
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def health_port() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


class Node:
    """The temporary "cluster": its inventory, the files the converge manages, the report directory."""

    def __init__(self, tmp_path: Path, health_port: int) -> None:
        self.root = tmp_path / "root"
        self.reports = tmp_path / "reports"
        self.inventory = tmp_path / "inventory.yml"
        self.group_vars = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "ansible_become": False,
            # One node, one rank: the kimi role's layout check passes.
            "kimi_gpus_per_node": 1,
            "kimi_tensor_parallel_size": 1,
            "kimi_pipeline_parallel_size": 1,
            "kimi_report_dir": str(self.reports),
            # The converge stand-in and what it writes.
            "drift_converge_playbook": str(FIXTURES / "converge.yml"),
            "drift_fixture_root": str(self.root),
            "drift_fixture_iface": "lo",
            "drift_fixture_api_key": OLD_KEY,
            # Parity over this machine's real stack: nothing pinned that a workstation cannot have.
            "kimi_vllm_pip_pins": {},
            "drift_resolve_pins": False,
            "kimi_deb_pins": {},
            "kimi_cuda_version": "",
            "kimi_nccl_env": {"NCCL_SOCKET_IFNAME": "lo"},
            "kimi_vllm_venv_path": sys.prefix,
            "kimi_nccl_env_file": str(self.root / "etc/kimi/nccl.env"),
            "kimi_checkpoint_repo_id": REPO_ID,
            "kimi_checkpoint_revision": SHA,
            "kimi_checkpoint_dir": str(self.root / "data"),
            "drift_check_service": False,
            "drift_health_url": f"http://127.0.0.1:{health_port}/health",
            "drift_health_attempts": 1,
        }
        self.write_inventory()

    def write_inventory(self, **changes: Any) -> None:
        self.group_vars.update(changes)
        self.inventory.write_text(yaml.safe_dump({"kimi_nodes": {"hosts": {"node1": {}}, "vars": self.group_vars}}))

    def converge(self) -> None:
        result = run_playbook(FIXTURES / "converge.yml", self.inventory, timeout=300)
        assert result.rc == 0, result.failure_messages()
        # The checkpoint as the checkpoint role leaves it: its files, and a marker recording each one's Hub
        # checksum and its stat at verification.
        data = self.root / "data"
        data.mkdir(parents=True, exist_ok=True)
        for name, content in CHECKPOINT_FILES.items():
            (data / name).write_bytes(content)
        (data / ".kimi-checkpoint.json").write_text(json.dumps(self.marker()))

    def marker(self, **changes: Any) -> dict[str, Any]:
        files = [ck.RepoFile(name, len(content), sha256=hashlib.sha256(content).hexdigest())
                 for name, content in CHECKPOINT_FILES.items()]  # fmt: skip
        stats = {f.path: ck.file_stat(self.root / "data" / f.path) for f in files}
        base = {"version": 2, "repo_id": REPO_ID, "revision": SHA, "resolved_from": None, "file_count": len(files)}
        base.update(total_bytes=sum(f.size for f in files), include=[], exclude=[], verified_at="2026-01-01T00:00:00Z")
        base.update(files=ck.marker_files(files, stats))
        return {**base, **changes}

    def drift(self, check: bool = False, **extravars: Any) -> PlayResult:
        return run_playbook(DRIFT, self.inventory, extravars=extravars, check=check, timeout=600)

    def report(self) -> dict[str, Any]:
        return json.loads((self.reports / "drift-latest.json").read_text())

    def snapshot(self) -> dict[str, tuple[bytes, int]]:
        return {str(p): (p.read_bytes(), p.stat().st_mode) for p in sorted(self.root.rglob("*")) if p.is_file()}


@pytest.fixture
def node(tmp_path, health_port) -> Node:
    converged = Node(tmp_path, health_port)
    converged.converge()
    return converged


def drift_message(result: PlayResult) -> str:
    (failure,) = [f for f in result.failures if f["task"].startswith("Fail when anything drifted")]
    return failure["msg"]


def test_a_converged_node_is_no_drift_and_the_nested_run_stays_out_of_the_events(node):
    result = node.drift()
    assert result.rc == 0, result.failure_messages()
    assert result.changed == 0
    report = node.report()
    assert report["drifted"] is False
    assert report["converge"]["complete"] is True
    assert report["hosts"][0]["states"] == {"checkpoint": "ok", "service": "-", "health": "200"}
    assert (node.reports / "drift-latest.md").read_text().startswith("# Kimi K2 cluster drift: no drift")
    # The nested ansible-playbook's own tasks never appear among this run's events (its own callbacks only).
    tasks = {event.get("event_data", {}).get("task") for event in result.events}
    assert "Write this node's vLLM unit" not in tasks
    table = result.results_of("Show the drift table")["node1"]["msg"]
    assert table.startswith("no drift on 1 host(s)")


def test_hand_edits_are_named_with_their_diff_nothing_changes_and_no_secret_is_written(node):
    nccl = node.root / "etc/kimi/nccl.env"
    nccl.write_text(nccl.read_text() + "NCCL_DEBUG=INFO\n")
    unit = node.root / "etc/systemd/system/kimi-vllm.service"
    unit.write_text(unit.read_text().replace("Restart=always", "Restart=no"))
    node.write_inventory(drift_fixture_api_key=NEW_KEY)
    before = node.snapshot()

    result = node.drift()

    assert result.rc != 0
    assert result.changed == 0
    assert node.snapshot() == before
    message = drift_message(result)
    assert f"node1: edited: edited by hand: {nccl} (environment file)" in message
    assert f"node1: edited: edited by hand: {unit} (unit file)" in message
    secrets = node.root / "etc/kimi/vllm-secrets.env"
    assert f"node1: edited: edited by hand: {secrets} (environment file; content hidden by no_log)" in message
    markdown = (node.reports / "drift-latest.md").read_text()
    assert "  -NCCL_DEBUG=INFO" in markdown
    assert "  -Restart=no" in markdown
    assert "  +Restart=always" in markdown
    for path in node.reports.iterdir():
        text = path.read_text()
        assert NEW_KEY not in text, path
        assert OLD_KEY not in text, path


def test_a_failing_converge_is_drift_with_its_tail(node):
    result = node.drift(drift_converge_extra_vars={"drift_fixture_fail": True})
    assert result.rc != 0
    message = drift_message(result)
    assert "cluster: run: the check-mode converge exited 2" in message
    assert "node1: converge_failed: converge task failed: fixture_serve : Fail the converge here" in message
    (run,) = node.report()["cluster_findings"]
    assert "drift fixture: failing on purpose on node1" in run["diff"]
    assert "PLAY RECAP" in run["diff"]


def test_a_missing_converge_playbook_is_drift_not_silence(node):
    result = node.drift(drift_converge_playbook=str(node.root / "no-such-site.yml"))
    assert result.rc != 0
    assert "cluster: run: the check-mode converge exited" in drift_message(result)
    assert "left no record of this run" in drift_message(result)


def test_a_marker_of_another_revision_and_a_silent_health_endpoint(node):
    other = "fedcba9876543210fedcba9876543210fedcba98"
    (node.root / "data" / ".kimi-checkpoint.json").write_text(json.dumps(node.marker(revision=other)))
    result = node.drift(drift_health_url="http://127.0.0.1:9/health")
    assert result.rc != 0
    message = drift_message(result)
    assert (
        f'node1: checkpoint: checkpoint marker does not match the pin: revision is "{other}", pinned "{SHA}"' in message
    )
    assert "node1: health: http://127.0.0.1:9/health did not answer:" in message
    row = node.report()["hosts"][0]
    assert row["states"] == {"checkpoint": "mismatch", "service": "-", "health": "down"}


def test_a_same_size_corruption_is_named_with_host_and_file_and_a_restored_mtime_by_the_sample_hash(node):
    data = node.root / "data"
    weights = data / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    with weights.open("r+b") as handle:  # dd if=/dev/urandom bs=1 count=16 seek=4096 conv=notrunc
        handle.seek(4096)
        handle.write(os.urandom(16))
    os.utime(weights, ns=(mtime + 10**9, mtime + 10**9))  # the write's new mtime, whatever the clock granularity
    config = data / "config.json"
    kept = config.stat().st_mtime_ns
    config.write_bytes(config.read_bytes().replace(b"2", b"4"))
    os.utime(config, ns=(kept, kept))  # touch -d: the mtime put back, so only a hash finds it
    before = node.snapshot()

    # Both files hashed in this run: the sample of two covers the whole (two-file) checkpoint.
    result = node.drift(drift_checkpoint_sample_files=2)

    assert result.rc != 0
    assert result.changed == 0
    assert node.snapshot() == before
    message = drift_message(result)
    assert (
        f"node1: checkpoint: checkpoint file model.safetensors: changed since its verification "
        f"(mtime_ns {mtime + 10**9}, recorded {mtime})" in message
    ), message
    sha = hashlib.sha256(CHECKPOINT_FILES["config.json"]).hexdigest()
    assert f"node1: checkpoint: checkpoint file config.json: sha256 differs from the listed {sha}" in message
    row = node.report()["hosts"][0]
    assert row["states"]["checkpoint"] == "corrupt"
    assert [f["category"] for f in row["findings"] if f["kind"] == "checkpoint"] == ["stat", "sample"]


def test_a_version_1_marker_is_a_finding_until_the_next_converge_rewrites_it(node):
    old = node.marker(version=1)
    del old["files"]
    (node.root / "data" / ".kimi-checkpoint.json").write_text(json.dumps(old))
    result = node.drift(drift_converge=False)
    assert result.rc != 0
    assert (
        "node1: checkpoint: checkpoint marker "
        f"{node.root / 'data' / '.kimi-checkpoint.json'} is version 1: it records no per-file size, mtime and inode"
    ) in drift_message(result)
    assert node.report()["hosts"][0]["states"]["checkpoint"] == "old marker"


def test_drift_under_check_mode_still_runs_everything_and_writes_the_report(node):
    result = node.drift(check=True)
    assert result.rc == 0, result.failure_messages()
    assert result.changed == 0
    assert node.report()["converge"]["complete"] is True


def test_a_pin_set_that_does_not_resolve_is_incomplete_not_a_crash(node):
    unreachable_index = {
        "drift_resolve_pins": True,
        "drift_converge": False,
        "kimi_vllm_pip_pins": {"six": "1.16.0"},
        "vllm_pinset_index_url": "http://127.0.0.1:9/simple",
        "vllm_python_version": f"{sys.version_info.major}.{sys.version_info.minor}",
        "vllm_platforms": ["manylinux_2_36_x86_64"],
        "vllm_pinset_timeout": 120,
    }
    result = node.drift(**unreachable_index)
    assert result.rc != 0
    message = drift_message(result)
    assert "cluster: incomplete: the vLLM pin set could not be resolved" in message
    report = node.report()
    assert report["checks"]["converge"] is False
    assert "the check-mode converge was skipped (drift_converge is false)" in report["notes"]
