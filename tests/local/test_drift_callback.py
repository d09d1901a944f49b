"""The kimi_drift_changes callback on a real check-mode run: tests/fixtures/drift/converge.yml on this host
(local connection, every file under a temporary directory), after hand edits, with the callback enabled.

What Ansible really hands the callback is asserted here (diffs, would-run commands, handlers, failures,
unreachable hosts, no_log), and the recording the unit tests classify (changes-check-mode.jsonl) is checked
to be exactly what the callback writes today. Regenerate it after a deliberate change:
KIMI_UPDATE_FIXTURES=1 pytest tests/local/test_drift_callback.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ansible_run import REPO_ROOT, VENV_BIN

# Tier 2 (tests/tiers.py, group local-slow): make test-all, and CI while its time allows, or when its code changed.
pytestmark = pytest.mark.tier2("local-slow")

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "drift"
CONVERGE = FIXTURES / "converge.yml"
RECORDED = FIXTURES / "changes-check-mode.jsonl"
SECRET = "kimi-drift-secret-never-recorded-7f3a"
OLD_SECRET = "kimi-drift-old-secret-5c21"
RUN_ID = "test-run-1"
# dpkg_selections in check mode only compares: it holds nothing. Hosts without dpkg record no hold.
HOLD = ["bash"] if shutil.which("dpkg") else []


def ansible_playbook() -> str:
    beside = VENV_BIN / "ansible-playbook"
    return str(beside) if beside.exists() else shutil.which("ansible-playbook") or "ansible-playbook"


def environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("ANSIBLE_", "KIMI_DRIFT_")) or key in ("ANSIBLE_CONFIG",)
    }
    env.update(
        ANSIBLE_CONFIG=str(REPO_ROOT / "ansible.cfg"),
        ANSIBLE_HOME=str(tmp_path / "ansible-home"),
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-local"),
        ANSIBLE_NOCOLOR="1",
    )
    env.update(extra)
    return env


def write_inventory(tmp_path: Path, root: Path) -> Path:
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hosts = {
        "node1": {**local, "drift_fixture_root": str(root / "node1")},
        # Nothing listens on port 9 of the loopback: the connection is refused at once.
        "node2": {
            "ansible_host": "127.0.0.1",
            "ansible_port": 9,
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
            "drift_fixture_root": str(root / "node2"),
        },
        "node3": {**local, "drift_fixture_root": str(root / "node3"), "drift_fixture_fail": True},
    }
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"kimi_nodes": {"hosts": hosts}}))
    return inventory


def run(tmp_path: Path, inventory: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [ansible_playbook(), "-i", str(inventory), str(CONVERGE), *args]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def hand_edits(root: Path) -> None:
    """What people do on a node: edit the NCCL file, tighten a mode, add a line to the unit, delete a pin."""
    nccl = root / "etc/kimi/nccl.env"
    nccl.write_text(nccl.read_text().replace("=host0", "=eth1"))
    (root / "etc/kimi/vllm.env").chmod(0o600)
    unit = root / "etc/systemd/system/kimi-vllm.service"
    unit.write_text(unit.read_text().replace("Restart=always\n", "Restart=always\nEnvironment=NCCL_DEBUG=INFO\n"))
    (root / "etc/apt/preferences.d/kimi-nccl.pref").unlink()


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> dict[str, Any]:
    tmp_path = tmp_path_factory.mktemp("drift-callback")
    root = tmp_path / "root"
    inventory = write_inventory(tmp_path, root)
    first = run(
        tmp_path,
        inventory,
        "--limit",
        "node1,node3",
        "-e",
        json.dumps({"drift_fixture_api_key": OLD_SECRET, "drift_fixture_fail": False}),
        env=environment(tmp_path),
    )
    assert first.returncode == 0, first.stdout + first.stderr
    hand_edits(root / "node1")
    before = {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    modes = {str(p): p.stat().st_mode for p in sorted(root.rglob("*"))}
    changes = tmp_path / "changes.jsonl"
    extra = {"drift_fixture_api_key": SECRET, "drift_fixture_pip_drift": True, "drift_fixture_hold": HOLD}
    checked = run(
        tmp_path,
        inventory,
        "--check",
        "--diff",
        "-e",
        json.dumps(extra),
        env=environment(
            tmp_path,
            ANSIBLE_CALLBACKS_ENABLED="kimi_drift_changes",
            KIMI_DRIFT_CHANGES=str(changes),
            KIMI_DRIFT_RUN_ID=RUN_ID,
        ),
    )
    text = changes.read_text()
    return {
        "tmp_path": tmp_path,
        "root": root,
        "rc": checked.returncode,
        "output": checked.stdout + checked.stderr,
        "text": text,
        "records": [json.loads(line) for line in text.splitlines()],
        "unchanged": before == {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
        and modes == {str(p): p.stat().st_mode for p in sorted(root.rglob("*"))},
    }


def find(records: list[dict], **wanted: Any) -> dict:
    matching = [r for r in records if all(r.get(k) == v for k, v in wanted.items())]
    assert len(matching) == 1, f"{wanted}: {len(matching)} records\n" + "\n".join(map(str, records))
    return matching[0]


def test_check_mode_changed_nothing_and_the_run_failed_for_node3_and_node2(captured):
    assert captured["unchanged"]
    # 2: a host failed (node3 on purpose); node2 is unreachable.
    assert captured["rc"] in (2, 4), captured["output"]


def test_first_line_names_the_run_and_the_last_has_every_host(captured):
    records = captured["records"]
    assert records[0]["kind"] == "start"
    assert records[0]["run_id"] == RUN_ID
    assert records[0]["check_mode"] is True and records[0]["diff_mode"] is True
    assert records[-1]["kind"] == "stats"
    assert sorted(records[-1]["hosts"]) == ["node1", "node2", "node3"]
    assert records[-1]["hosts"]["node2"]["unreachable"] == 1


def test_a_hand_edited_file_is_recorded_with_its_path_role_and_diff(captured):
    record = find(captured["records"], host="node1", task="Write the NCCL and gloo environment every rank loads")
    assert record["kind"] == "change"
    assert record["role"] == "fixture_serve"
    assert record["action"] == "ansible.builtin.template"
    assert record["path"] == str(captured["root"] / "node1/etc/kimi/nccl.env")
    (diff,) = record["diff"]
    assert "NCCL_SOCKET_IFNAME=eth1" in diff["before"]
    assert "NCCL_SOCKET_IFNAME=host0" in diff["after"]
    assert diff["before_header"] == record["path"]


def test_a_mode_change_is_an_attribute_diff(captured):
    record = find(
        captured["records"],
        host="node1",
        task="Write this node's vLLM environment (VLLM_HOST_IP and the extra variables)",
    )
    (diff,) = record["diff"]
    assert diff["before"]["mode"] == "0600"
    assert diff["after"]["mode"] == "0644"


def test_a_missing_file_has_an_empty_before(captured):
    record = find(captured["records"], host="node1", task="Pin the packages in apt's preferences, file kimi-nccl")
    (diff,) = record["diff"]
    assert diff["before"] == ""
    assert "before_header" not in diff
    assert "Package: libnccl2" in diff["after"]
    assert record["path"].endswith("/etc/apt/preferences.d/kimi-nccl.pref")


def test_no_log_content_never_reaches_the_record(captured):
    assert SECRET not in captured["text"]
    assert OLD_SECRET not in captured["text"]
    for host in ("node1", "node3"):
        record = find(
            captured["records"], host=host, task="Write the API key for rank 0 (mode 0600; never in the unit or argv)"
        )
        assert record["censored"] is True
        assert record["path"].endswith("/etc/kimi/vllm-secrets.env")
        assert not {"diff", "msg", "cmd"} & set(record)


def test_commands_check_mode_skips_are_recorded_as_would_run(captured):
    pip = find(
        captured["records"], host="node1", task="Install the pins with every distribution fixed by the constraints file"
    )
    assert pip["kind"] == "would_run"
    assert " -m pip --version" in pip["cmd"]
    handler = find(captured["records"], host="node1", task="Restart the group")
    assert handler["kind"] == "would_run"
    assert handler["handler"] is True


@pytest.mark.skipif(not HOLD, reason="no dpkg on this host: dpkg_selections cannot be recorded")
def test_a_package_not_held_is_one_record_per_loop_item(captured):
    record = find(captured["records"], host="node1", task="Hold the packages against unattended upgrades for kimi-nccl")
    assert record["item"] == "bash"
    assert record["action"] == "ansible.builtin.dpkg_selections"


def test_failures_and_unreachable_hosts_are_recorded(captured):
    failed = find(captured["records"], kind="failed")
    assert failed["host"] == "node3"
    assert failed["msg"] == "drift fixture: failing on purpose on node3"
    assert failed["ignored"] is False
    unreachable = find(captured["records"], kind="unreachable")
    assert unreachable["host"] == "node2"
    assert "Connection refused" in unreachable["msg"] or "ssh" in unreachable["msg"]


def test_unchanged_results_and_false_conditions_are_not_recorded(captured):
    tasks = {r.get("task") for r in captured["records"] if r.get("host") == "node1"}
    assert "Create apt's preferences directory" not in tasks
    assert "Fail the converge here when asked (a converge that cannot finish)" not in tasks


def normalized(text: str, tmp_path: Path) -> list[dict]:
    """The record with this run's accidents replaced: temporary paths, the interpreter, the time."""
    text = text.replace(str(tmp_path), "<tmp>")
    text = re.sub(r'"[^"]*/ansible-local-[^"]*/([^/"]+)"', r'"<ansible-local>/\1"', text)
    text = text.replace(sys.executable, "<python>").replace(str(REPO_ROOT), "<repo>")
    records = []
    for line in text.splitlines():
        record = json.loads(line)
        if record["kind"] == "start":
            record["time"] = "<time>"
        if record.get("msg") and "Failed to connect" in record["msg"]:
            record["msg"] = (
                "Failed to connect to the host via ssh: ssh: connect to host 127.0.0.1 port 9: Connection refused"
            )
        records.append(record)
    order = {"start": 0, "stats": 2}
    return sorted(
        records, key=lambda r: (order.get(r["kind"], 1), r.get("host") or "", r.get("task") or "", str(r.get("item")))
    )


@pytest.mark.skipif(not HOLD, reason="the recording has a dpkg hold; this host has no dpkg")
def test_the_recorded_fixture_is_what_the_callback_writes(captured):
    fresh = normalized(captured["text"], captured["tmp_path"])
    if os.environ.get("KIMI_UPDATE_FIXTURES") == "1":
        RECORDED.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in fresh))
    recorded = [json.loads(line) for line in RECORDED.read_text().splitlines()]
    assert fresh == recorded


def test_the_callback_is_inert_unless_enabled(tmp_path):
    inventory = tmp_path / "inventory.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory.write_text(
        yaml.safe_dump({"kimi_nodes": {"hosts": {"node1": {**local, "drift_fixture_root": str(tmp_path / "r")}}}})
    )
    changes = tmp_path / "changes.jsonl"
    plain = run(
        tmp_path,
        inventory,
        "--check",
        "-e",
        json.dumps({"drift_fixture_api_key": "x"}),
        env=environment(tmp_path, KIMI_DRIFT_CHANGES=str(changes)),
    )
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert not changes.exists()
    enabled_without_file = run(
        tmp_path,
        inventory,
        "--check",
        "-e",
        json.dumps({"drift_fixture_api_key": "x"}),
        env=environment(tmp_path, ANSIBLE_CALLBACKS_ENABLED="kimi_drift_changes"),
    )
    assert enabled_without_file.returncode == 0, enabled_without_file.stdout + enabled_without_file.stderr
    assert "KIMI_DRIFT_CHANGES names no file" in enabled_without_file.stdout + enabled_without_file.stderr
