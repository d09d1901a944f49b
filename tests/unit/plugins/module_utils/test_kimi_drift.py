"""Drift findings from recorded and constructed inputs: the callback's record of a real check-mode run
(tests/fixtures/drift/changes-check-mode.jsonl), parity over recorded stack facts, checkpoint markers,
systemctl output, /health answers; the report, its Markdown, the table and the verdict; the module."""

from __future__ import annotations

import base64
import copy
import hashlib
import importlib.util
import json
import os
from pathlib import Path

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_checkpoint as ck
from ansible_collections.kimi.k2.plugins.module_utils.kimi_drift_record import (
    KINDS,
    change_finding,
    classify,
    converge_findings,
    parse_changes,
    render_diff,
)
from ansible_collections.kimi.k2.plugins.module_utils.kimi_drift_render import (
    render_markdown,
    render_table,
    report_json,
)
from ansible_collections.kimi.k2.plugins.module_utils.kimi_drift_rules import (
    build_report,
    checkpoint_state,
    exit_code,
    health_state,
    parity_findings,
    service_state,
)
from ansible_collections.kimi.k2.plugins.module_utils.kimi_parity import Pins, compare
from ansible_collections.kimi.k2.plugins.module_utils.kimi_replicas import replica_by_host
from ansible_collections.kimi.k2.plugins.module_utils.kimi_systemd import parse_systemctl_show

from tests import paths
from tests.unit.ansible_adhoc import run_module

REPO = paths.REPO_ROOT
FIXTURES = REPO / "tests" / "fixtures" / "drift"
FACTS = REPO / "tests" / "fixtures" / "stack" / "facts"
RECORDED_RUN_ID = "test-run-1"
CONSTRUCTED_RUN_ID = "constructed-1"
REPO_ID = "moonshotai/Kimi-K2.7-Code"
SHA = "0123456789abcdef0123456789abcdef01234567"
OTHER_SHA = "fedcba9876543210fedcba9876543210fedcba98"
CHECKPOINT = {
    "repo_id": REPO_ID,
    "revision": SHA,
    "include": [],
    "exclude": [],
    "marker_path": "/data/m/.kimi-checkpoint.json",
}


def recorded() -> list[dict]:
    return parse_changes((FIXTURES / "changes-check-mode.jsonl").read_text())[0]


def constructed() -> list[dict]:
    return parse_changes((FIXTURES / "changes-constructed.jsonl").read_text())[0]


def by_task(findings, task: str, host: str = "node1"):
    matching = [f for f in findings if f.host == host and f.source.get("task") == task]
    assert len(matching) == 1, [f.line() for f in findings]
    return matching[0]


def slurped(marker: dict | str) -> dict:
    text = marker if isinstance(marker, str) else json.dumps(marker)
    return {"content": base64.b64encode(text.encode()).decode(), "encoding": "base64", "source": "/m"}


def marker(**changes) -> dict:
    base = {
        "version": 2,
        "repo_id": REPO_ID,
        "revision": SHA,
        "resolved_from": None,
        "file_count": 3,
        "total_bytes": 10,
        "include": [],
        "exclude": [],
        "verified_at": "2026-01-01T00:00:00Z",
    }
    return {**base, **changes}


def systemctl(name: str) -> dict:
    return {"rc": 0, "stdout": (FIXTURES / "systemctl" / name).read_text(), "stderr": ""}


# ------------------------------------------------------------------------------------ the converge's record


def test_parse_changes_keeps_records_and_counts_cut_lines():
    text = (FIXTURES / "changes-check-mode.jsonl").read_text() + '{"kind": "change", "host": "no\n[1, 2]\n'
    records, bad = parse_changes(text)
    assert len(records) == 15
    assert bad == 2


@pytest.mark.parametrize(
    ("task", "category"),
    [
        ("Write the NCCL and gloo environment every rank loads", "env_file"),
        ("Write this node's vLLM environment (VLLM_HOST_IP and the extra variables)", "env_file"),
        ("Write the API key for rank 0 (mode 0600; never in the unit or argv)", "env_file"),
        ("Write this node's vLLM unit", "unit_file"),
        ("Pin the packages in apt's preferences, file kimi-nccl", "file"),
        ("Install the pins with every distribution fixed by the constraints file", "pip"),
        ("Hold the packages against unattended upgrades for kimi-nccl", "hold"),
        ("Restart the group", "command"),
    ],
)
def test_recorded_results_are_classified_by_action_and_path(task, category):
    (record,) = [r for r in recorded() if r.get("task") == task and r.get("host") == "node1"]
    assert classify(record) == category


@pytest.mark.parametrize(
    ("task", "category"),
    [
        ("Install the packages at their pinned versions for kimi-nccl", "package"),
        ("Make the CUDA libraries visible to the dynamic linker", "file"),
        ("Write the Ray head unit", "unit_file"),
        ("Stop rank 0 (the API) first", "service"),
        ("Install the pinned hf CLI in its own venv", "pip"),
    ],
)
def test_constructed_results_are_classified_by_action_and_path(task, category):
    (record,) = [r for r in constructed() if r.get("task") == task]
    assert classify(record) == category


def test_a_hand_edited_environment_file_is_named_with_its_diff():
    findings, _, _ = converge_findings(recorded(), 0, {"rc": 2}, RECORDED_RUN_ID)
    finding = by_task(findings, "Write the NCCL and gloo environment every rank loads")
    assert finding.kind == "edited"
    assert finding.title == "edited by hand: <tmp>/root/node1/etc/kimi/nccl.env (environment file)"
    assert "fixture_serve : Write the NCCL" in finding.detail
    diff = finding.diff.splitlines()
    assert diff[0] == "--- <tmp>/root/node1/etc/kimi/nccl.env (on the node)"
    assert diff[1] == "+++ <tmp>/root/node1/etc/kimi/nccl.env (what the converge writes)"
    assert "-NCCL_SOCKET_IFNAME=eth1" in diff
    assert "+NCCL_SOCKET_IFNAME=host0" in diff


def test_a_hand_edited_unit_file_shows_the_added_line():
    findings, _, _ = converge_findings(recorded(), 0, {"rc": 2}, RECORDED_RUN_ID)
    finding = by_task(findings, "Write this node's vLLM unit")
    assert finding.title == "edited by hand: <tmp>/root/node1/etc/systemd/system/kimi-vllm.service (unit file)"
    assert "-Environment=NCCL_DEBUG=INFO" in finding.diff.splitlines()


def test_a_mode_change_is_shown_as_the_attribute_that_differs():
    findings, _, _ = converge_findings(recorded(), 0, {"rc": 2}, RECORDED_RUN_ID)
    finding = by_task(findings, "Write this node's vLLM environment (VLLM_HOST_IP and the extra variables)")
    assert finding.kind == "edited"
    assert finding.diff == "mode: 0600 -> 0644"


def test_a_no_log_file_is_named_but_nothing_of_its_content():
    findings, _, _ = converge_findings(recorded(), 0, {"rc": 2}, RECORDED_RUN_ID)
    finding = by_task(findings, "Write the API key for rank 0 (mode 0600; never in the unit or argv)")
    assert finding.kind == "edited"
    assert "content hidden by no_log" in finding.title
    assert finding.diff == ""
    assert finding.source["censored"] is True


def test_a_deleted_managed_file_is_missing_and_a_command_would_run():
    findings, _, _ = converge_findings(recorded(), 0, {"rc": 2}, RECORDED_RUN_ID)
    missing = by_task(findings, "Pin the packages in apt's preferences, file kimi-nccl")
    assert missing.kind == "converge"
    assert missing.title.startswith("file: <tmp>/root/node1/etc/apt/preferences.d/kimi-nccl.pref is missing")
    pip = by_task(findings, "Install the pins with every distribution fixed by the constraints file")
    assert pip.title == "pip would run: Install the pins with every distribution fixed by the constraints file"
    assert "<python> -m pip --version" in pip.detail
    handler = by_task(findings, "Restart the group")
    assert handler.title == "handler would run: fixture_serve : Restart the group"


def test_failures_and_unreachable_hosts_of_the_converge_are_per_host_and_the_exit_is_a_run_finding():
    run = {"rc": 2, "stdout_tail": ["PLAY RECAP", "node3 : ok=8 failed=1"], "stderr_tail": ["[ERROR]: boom"]}
    findings, notes, summary = converge_findings(recorded(), 0, run, RECORDED_RUN_ID)
    (failed,) = [f for f in findings if f.kind == "converge_failed" and f.host == "node3"]
    assert failed.title == (
        "converge task failed: fixture_serve : Fail the converge here when asked (a converge that cannot finish): "
        "drift fixture: failing on purpose on node3"
    )
    (unreachable,) = [f for f in findings if f.host == "node2"]
    assert unreachable.kind == "converge_failed"
    assert "unreachable during the converge" in unreachable.title
    (exit_finding,) = [f for f in findings if f.kind == "run"]
    assert exit_finding.host is None
    assert exit_finding.title == "the check-mode converge exited 2"
    assert exit_finding.diff == "PLAY RECAP\nnode3 : ok=8 failed=1\n--- stderr ---\n[ERROR]: boom"
    assert summary["complete"] is True
    assert summary["changes"] == 11
    assert notes == []


def test_a_record_of_another_run_is_not_read_and_that_is_drift():
    findings, _, summary = converge_findings(recorded(), 0, {"rc": 0}, "another-run")
    assert [f.kind for f in findings] == ["run"]
    assert findings[0].title == "the check-mode converge left no record of this run"
    assert summary["complete"] is False


def test_no_record_at_all_names_the_callback_and_keeps_the_tail():
    run = {"rc": 1, "stdout_tail": [], "stderr_tail": ["ERROR! the playbook: /x/site.yml could not be found"]}
    findings, _, _ = converge_findings([], 0, run, "r1")
    assert [f.title for f in findings] == ["the check-mode converge exited 1 and left no record of this run"]
    assert "callback" in findings[0].detail
    assert "could not be found" in findings[0].diff


def test_a_converge_that_timed_out_or_lost_its_summary_is_drift():
    records = [r for r in recorded() if r["kind"] != "stats"]
    findings, _, summary = converge_findings(records, 0, {"rc": 0}, RECORDED_RUN_ID)
    assert "the check-mode converge ended without its summary" in [f.title for f in findings]
    assert summary["complete"] is False
    findings, _, _ = converge_findings(
        records, 0, {"error": "The command action failed to execute in time"}, RECORDED_RUN_ID
    )
    assert "the check-mode converge did not finish: The command action failed to execute in time" in [
        f.title for f in findings
    ]


def test_a_converge_without_check_mode_is_refused_as_drift():
    records = copy.deepcopy(recorded())
    records[0]["check_mode"] = False
    findings, _, _ = converge_findings(records, 0, {"rc": 0}, RECORDED_RUN_ID)
    assert "the converge ran without --check: drift.yml must never converge" in [f.title for f in findings]


def test_ignored_failures_and_tasks_check_mode_cannot_judge_are_notes_only():
    findings, notes, _ = converge_findings(constructed(), 0, {"rc": 2}, CONSTRUCTED_RUN_ID)
    assert not [f for f in findings if "Wait for /health" in f.title]
    assert notes[0] == "node1: check mode cannot evaluate vllm_serve : Read the running API unit's invocation"
    assert notes[1].startswith(
        "node1: the converge ignores a failure of vllm_serve : Wait for /health on rank 0: Status"
    )


def test_constructed_package_service_and_ray_unit_changes():
    findings, _, _ = converge_findings(constructed(), 0, {"rc": 2}, CONSTRUCTED_RUN_ID)
    apt = by_task(findings, "Install the packages at their pinned versions for kimi-nccl", host="node2")
    assert (
        apt.title
        == "package: nvidia_repo : Install the packages at their pinned versions for kimi-nccl would change packages"
    )
    assert "The following packages will be DOWNGRADED:" in apt.diff
    ray = by_task(findings, "Write the Ray head unit")
    assert ray.kind == "edited"
    assert "+ExecStart=/opt/vllm/current/bin/ray start --head --port 6380 --block" in ray.diff.splitlines()
    stop = by_task(findings, "Stop rank 0 (the API) first")
    assert stop.title == "service: vllm_serve : Stop rank 0 (the API) first would change a unit's state"
    broken = next(f for f in findings if f.kind == "converge_failed")
    assert broken.title.endswith("found broken requirements:")
    assert "torch 2.11.0 has requirement" in broken.detail


def test_render_diff_of_a_binary_or_prepared_entry():
    assert render_diff([{"src_binary": True}]) == "(binary content: no text diff)"
    assert render_diff([{"prepared": "x\n"}]) == "x"
    assert render_diff([{"before": "a\n", "after": "a\n"}]) == ""


# --------------------------------------------------------------------------------------------- parity


def parity_result(cluster: dict, pins: dict) -> dict:
    """kimi_parity's module result (fail_on_mismatch false) for recorded stack facts."""
    report = compare(cluster, Pins.from_dict(pins))
    return {
        "ok": report["ok"],
        "summary": report["summary"],
        "failures": report["failures"],
        "parity_warnings": report["warnings"],
    }


@pytest.fixture
def parity_skew() -> dict:
    cluster = {name: json.loads((FACTS / f"{name}.json").read_text()) for name in ("node1", "node2", "node3")}
    pins = {
        "debs": {"libnccl2": "2.30.7-1+cuda13.3", "libnccl-dev": "2.30.7-1+cuda13.3"},
        "wheels": {"vllm": "0.23.0", "torch": "2.11.0", "nvidia-nccl-cu13": "2.28.9"},
        "nccl_env": {"NCCL_SOCKET_IFNAME": "host0"},
    }
    return parity_result(cluster, pins)


def test_parity_failures_become_version_hold_and_parity_findings(parity_skew):
    findings, _ = parity_findings(parity_skew)
    kinds = sorted((f.host, f.kind, f.source["item"]) for f in findings)
    assert kinds == [
        ("node2", "hold", "hold:libnccl2"),
        ("node2", "version", "deb:libnccl2"),
        ("node3", "parity", "nccl:version"),
        ("node3", "version", "wheel:nvidia-nccl-cu13"),
    ]
    wheel = next(f for f in findings if f.source["item"] == "wheel:nvidia-nccl-cu13")
    assert wheel.title == "nvidia-nccl-cu13 (wheel) is 2.30.4, expected 2.28.9 (pinned)"
    assert wheel.fix == "on node3: /opt/vllm/0.23.0/bin/python -m pip install --no-deps 'nvidia-nccl-cu13==2.28.9'"


def test_parity_that_could_not_run_is_incomplete():
    findings, _ = parity_findings({"failed": True, "msg": "no host facts to compare"})
    assert [(f.kind, f.title) for f in findings] == [("incomplete", "parity could not run: no host facts to compare")]


def test_a_pinned_deb_not_held_is_reported_once(parity_skew):
    records = [r for r in constructed() if r["kind"] in ("start", "stats") or r.get("item") == "libnccl2"]
    report = build_report(
        hosts=["node1", "node2", "node3"],
        records=records,
        run={"rc": 0},
        run_id=CONSTRUCTED_RUN_ID,
        parity=parity_skew,
        checks={"checkpoint": False, "service": False, "health": False},
    )
    node2 = next(row for row in report["hosts"] if row["host"] == "node2")
    assert [f["kind"] for f in node2["findings"]] == ["version", "hold"]


# ----------------------------------------------------------------------------------------- checkpoint


def test_the_pinned_marker_is_ok():
    assert checkpoint_state("node1", slurped(marker()), CHECKPOINT) == ("ok", [])


def test_a_missing_marker_and_an_unreadable_one():
    state, findings = checkpoint_state("node1", {"msg": "file not found: /data/m/.kimi-checkpoint.json"}, CHECKPOINT)
    assert state == "missing"
    assert findings[0].title == "no checkpoint marker at /data/m/.kimi-checkpoint.json"
    state, findings = checkpoint_state("node1", slurped("{not json"), CHECKPOINT)
    assert (state, findings[0].kind) == ("unreadable", "checkpoint")
    state, _ = checkpoint_state("node1", {"msg": "Permission denied"}, CHECKPOINT)
    assert state == "unreadable"


def test_a_marker_of_another_revision_or_pattern_names_each_difference():
    state, findings = checkpoint_state("node1", slurped(marker(revision=OTHER_SHA, include=["*.json"])), CHECKPOINT)
    assert state == "mismatch"
    assert findings[0].title == (
        f'checkpoint marker does not match the pin: revision is "{OTHER_SHA}", pinned "{SHA}"; '
        'include is ["*.json"], pinned []'
    )


def test_a_marker_without_verification_is_drift():
    state, findings = checkpoint_state("node1", slurped(marker(verified_at=None)), CHECKPOINT)
    assert state == "unverified"
    assert "records no verification" in findings[0].title


def test_a_branch_pin_is_compared_with_what_the_marker_was_resolved_from():
    expected = {**CHECKPOINT, "revision": "main", "allow_branch": True}
    assert checkpoint_state("node1", slurped(marker(resolved_from="main")), expected)[0] == "ok"
    state, findings = checkpoint_state("node1", slurped(marker(resolved_from="v2")), expected)
    assert state == "mismatch"
    assert 'revision is "v2", pinned "main"' in findings[0].title


def test_a_version_1_marker_says_its_files_cannot_be_checked_until_the_next_converge():
    state, findings = checkpoint_state("node1", slurped(marker(version=1)), CHECKPOINT, {"skipped": True})
    assert state == "old marker"
    (finding,) = findings
    assert finding.line() == (
        "node1: checkpoint: checkpoint marker /data/m/.kimi-checkpoint.json is version 1: it records no per-file "
        "size, mtime and inode, so the checkpoint files cannot be checked until the next converge rewrites it"
    )
    assert finding.fix.startswith("run the checkpoint phase") and "rewrites the marker as version 2" in finding.fix
    # A version from the future is no old marker: it does not match.
    assert checkpoint_state("node1", slurped(marker(version=3)), CHECKPOINT)[0] == "mismatch"


def files_read(stale=(), sampled=(), sample_problems=()) -> dict:
    """kimi_checkpoint_info's answer, as drift.yml registers it."""
    return {
        "changed": False,
        "files_recorded": 7,
        "stale": list(stale),
        "stale_paths": [line.split(": ", 1)[0] for line in stale],
        "sampled": list(sampled),
        "sample_problems": list(sample_problems),
    }


STALE = "model.safetensors: changed since its verification (mtime_ns 1767225600123456789, recorded 17671392)"


def test_a_file_changed_after_its_verification_is_named_with_host_and_file():
    state, findings = checkpoint_state("node2", slurped(marker()), CHECKPOINT, files_read(stale=[STALE]))
    assert state == "changed"
    (finding,) = findings
    assert finding.line() == f"node2: checkpoint: checkpoint file {STALE}"
    assert "in /data/m:" in finding.detail and "--tags checkpoint" in finding.fix
    assert checkpoint_state("node2", slurped(marker()), CHECKPOINT, files_read(sampled=["config.json"])) == ("ok", [])


def test_more_than_ten_changed_files_are_counted_in_one_more_finding():
    stale = [f"model-{n:05d}.safetensors: missing" for n in range(13)]
    _, findings = checkpoint_state("node1", slurped(marker()), CHECKPOINT, files_read(stale=stale))
    assert len(findings) == 11
    assert findings[-1].title == "3 more checkpoint file(s) changed since their verification"
    assert findings[-1].detail.startswith("model-00010.safetensors: missing")


def test_a_sampled_file_whose_content_differs_is_corrupt_and_needs_a_forced_verification():
    problem = f"model.safetensors: sha256 differs from the listed {'a' * 64}"
    read = files_read(sampled=["model.safetensors"], sample_problems=[problem])
    state, findings = checkpoint_state("node1", slurped(marker()), CHECKPOINT, read)
    assert state == "corrupt"
    (finding,) = findings
    assert finding.line() == (
        f"node1: checkpoint: checkpoint file {problem} "
        "(rotating sample hash; its size, mtime and inode are as recorded)"
    )
    assert finding.fix == "ansible-playbook site.yml --tags checkpoint -e checkpoint_force_verify=true"


def test_files_that_could_not_be_checked_are_a_finding_not_a_crash():
    state, findings = checkpoint_state(
        "node1", slurped(marker()), CHECKPOINT, {"failed": True, "msg": "Permission denied\n  on /data/m"}
    )
    assert state == "unknown"
    assert findings[0].title == "could not check the checkpoint files: Permission denied on /data/m"


def test_a_same_size_corruption_on_one_node_is_reported_with_host_and_file(tmp_path):
    # The node side for real: a marker written from verified files, then dd conv=notrunc on node2's weights.
    data = b"\x00" * 8192
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(data)
    files = [ck.RepoFile("model.safetensors", len(data), sha256=hashlib.sha256(data).hexdigest())]
    recorded = ck.marker_files(files, {"model.safetensors": ck.file_stat(weights)})
    mtime = weights.stat().st_mtime_ns
    with weights.open("r+b") as handle:
        handle.seek(4096)
        handle.write(b"\xff" * 16)
    os.utime(weights, ns=(mtime + 10**9, mtime + 10**9))  # what the write does, on a clock coarser than the test
    stale = ck.stat_differences(recorded, {"model.safetensors": ck.file_stat(weights)})
    nodes = {
        "node1": {
            "marker": slurped(marker(files=recorded)),
            "checkpoint_files": files_read(sampled=["model.safetensors"]),
        },
        "node2": {"marker": slurped(marker(files=recorded)), "checkpoint_files": files_read(stale=stale)},
    }
    report = build_report(
        hosts=["node1", "node2"],
        nodes=nodes,
        checkpoint=CHECKPOINT,
        checks={"converge": False, "service": False, "health": False},
    )
    assert report["drifted"] is True
    assert report["messages"] == [
        f"node2: checkpoint: checkpoint file model.safetensors: changed since its verification "
        f"(mtime_ns {mtime + 10**9}, recorded {mtime})"
    ]
    assert [row["states"]["checkpoint"] for row in report["hosts"]] == ["ok", "changed"]
    assert "node1: checkpoint sample hashed, as the marker records: model.safetensors" in report["notes"]
    assert "changed !" in render_table(report)


def test_without_a_pinned_checkpoint_the_cluster_gets_one_finding():
    report = build_report(
        hosts=["node1", "node2"],
        nodes={"node1": {"marker": slurped(marker())}, "node2": {"marker": slurped(marker())}},
        checkpoint={"repo_id": "", "revision": ""},
        checks={"converge": False, "service": False, "health": False},
    )
    assert report["messages"] == [
        "cluster: incomplete: kimi_checkpoint_repo_id and kimi_checkpoint_revision are not set: "
        "the checkpoint markers cannot be compared"
    ]


# -------------------------------------------------------------------------------------------- service


def test_systemctl_show_blocks_parse_per_unit():
    units = parse_systemctl_show(systemctl("rank0-active.txt")["stdout"])
    assert units["kimi-vllm.service"]["ActiveState"] == "active"
    assert units["kimi-vllm-headless.service"]["LoadState"] == "not-found"


def test_rank_0_active_is_fine_and_restarting_with_a_stale_headless_unit_is_not():
    assert service_state("node1", 0, "mp", systemctl("rank0-active.txt")) == ("active", [])
    state, findings = service_state("node1", 0, "mp", systemctl("rank0-restarting-stale-headless.txt"))
    assert state == "activating"
    assert [f.title for f in findings] == [
        "kimi-vllm.service is activating (auto-restart)",
        "kimi-vllm-headless.service is installed here (inactive) but node rank 0 runs kimi-vllm.service",
    ]


def test_a_failed_headless_rank_and_a_ray_worker():
    state, findings = service_state("node2", 1, "mp", systemctl("headless-failed.txt"))
    assert state == "failed"
    assert findings[0].title == "kimi-vllm-headless.service is failed (failed)"
    # A Ray worker runs no vLLM unit: the headless unit on it is one too many.
    state, findings = service_state("node2", 1, "ray", systemctl("headless-failed.txt"))
    assert state == "-"
    assert "node rank 1 runs no vLLM unit in this layout" in findings[0].title


def test_a_missing_unit_and_a_node_without_systemd():
    state, findings = service_state("node2", 1, "mp", systemctl("rank0-active.txt"))
    assert state == "not installed"
    assert [f.title for f in findings] == [
        "kimi-vllm.service is installed here (active) but node rank 1 runs kimi-vllm-headless.service",
        "kimi-vllm-headless.service is not installed (LoadState=not-found)",
    ]
    state, findings = service_state(
        "node2",
        1,
        "mp",
        {"rc": 1, "stdout": "", "stderr": "System has not been booted with systemd\nFailed to connect"},
    )
    assert state == "unknown"
    assert (
        findings[0].title
        == "could not read the vLLM units' state: System has not been booted with systemd Failed to connect"
    )


def test_health_answers():
    assert health_state("node1", {"status": 200, "url": "http://127.0.0.1:8000/health"}) == ("200", [])
    state, findings = health_state("node1", {"status": 503, "url": "http://127.0.0.1:8000/health"})
    assert (state, findings[0].title) == ("503", "http://127.0.0.1:8000/health answered 503, not 200")
    state, findings = health_state("node1", {"status": -1, "url": "u", "msg": "Connection refused"})
    assert (state, findings[0].title) == ("down", "u did not answer: Connection refused")
    assert health_state("node2", {"skipped": True}) == ("-", [])


# --------------------------------------------------------------------------------------------- report


def clean_nodes() -> dict:
    return {
        "node1": {"marker": slurped(marker()), "units": systemctl("rank0-active.txt"), "health": {"status": 200}},
        "node2": {
            "marker": slurped(marker()),
            "units": {"rc": 0, "stdout": "Id=kimi-vllm-headless.service\nLoadState=loaded\nActiveState=active\n"},
            "health": {"skipped": True},
        },
    }


def clean_records() -> list[dict]:
    return [
        {"kind": "start", "run_id": "r1", "check_mode": True, "diff_mode": True},
        {"kind": "stats", "hosts": {"node1": {"changed": 0}, "node2": {"changed": 0}}},
    ]


def report_for(**overrides) -> dict:
    arguments = {
        "hosts": ["node1", "node2"],
        "ranks": {"node1": 0, "node2": 1},
        "records": clean_records(),
        "run": {"rc": 0},
        "run_id": "r1",
        "parity": {"ok": True, "failures": [], "parity_warnings": [{"message": "node2: kernel differs"}]},
        "nodes": clean_nodes(),
        "checkpoint": CHECKPOINT,
        "generated_at": "2026-01-01T00:00:00Z",
    }
    arguments.update(overrides)
    return build_report(**arguments)


def test_a_clean_cluster_is_no_drift_and_exits_0():
    report = report_for()
    assert report["drifted"] is False
    assert exit_code(report) == 0
    assert report["messages"] == []
    assert report["notes"] == ["warning: node2: kernel differs"]
    table = render_table(report).splitlines()
    assert table[0] == "no drift on 2 host(s)"
    columns = "host rank edited converge versions holds parity checkpoint service health verdict"
    assert table[2].split() == columns.split()
    assert table[4].split() == ["node1", "0", "ok", "ok", "ok", "ok", "ok", "ok", "active", "200", "ok"]
    assert table[5].split() == ["node2", "1", "ok", "ok", "ok", "ok", "ok", "ok", "active", "-", "ok"]


def test_every_kind_of_finding_drifts_and_the_table_marks_its_column(parity_skew):
    nodes = clean_nodes()
    nodes["node1"]["health"] = {"status": -1, "msg": "refused", "url": "http://127.0.0.1:8000/health"}
    nodes["node2"]["marker"] = {"msg": "file not found: /data/m/.kimi-checkpoint.json"}
    records = [
        {**r, "host": "node2"} if r.get("host") == "node1" else r
        for r in recorded()
        if r.get("host") in (None, "node1")
    ]
    for record in records:
        if record["kind"] == "start":
            record["run_id"] = "r1"
    report = report_for(
        records=records,
        run={"rc": 2},
        parity={**parity_skew, "failures": [f for f in parity_skew["failures"] if f["host"] == "node2"]},
        nodes=nodes,
    )
    assert report["drifted"] is True
    assert exit_code(report) == 1
    assert report["messages"][0] == "cluster: run: the check-mode converge exited 2"
    assert "node1: health: http://127.0.0.1:8000/health did not answer: refused" in report["messages"]
    node2 = next(row for row in report["hosts"] if row["host"] == "node2")
    assert node2["counts"] == {"edited": 4, "converge": 4, "version": 1, "hold": 1, "checkpoint": 1}
    cells = render_table(report).splitlines()[5].split()
    assert cells == ["node2", "1", "4", "!", "4", "!", "1", "!", "1", "!", "ok", "missing", "!", "active", "-", "DRIFT"]
    # Findings of a host come in the documented order of kinds.
    order = [KINDS.index(f["kind"]) for f in node2["findings"]]
    assert order == sorted(order)


def test_an_unreachable_node_is_one_finding_not_a_cascade(parity_skew):
    nodes = clean_nodes()
    nodes["node2"] = {"unreachable": True, "msg": "Failed to connect to the host via ssh: timed out\n"}
    cluster = {"node1": json.loads((FACTS / "node1.json").read_text()), "node2": None}
    parity = parity_result(cluster, {"debs": {"libnccl2": "2.30.7-1+cuda13.3"}})
    report = report_for(nodes=nodes, parity=parity)
    assert report["messages"] == [
        "node2: unreachable: could not be read: Failed to connect to the host via ssh: timed out"
    ]
    node2 = report["hosts"][1]
    assert node2["states"] == {"checkpoint": "?", "service": "?", "health": "?"}


def test_a_node_that_answered_but_whose_stack_could_not_be_read_says_why():
    nodes = clean_nodes()
    nodes["node2"]["stack_error"] = "could not read the stack facts: [Errno 13] Permission denied"
    cluster = {"node1": json.loads((FACTS / "node1.json").read_text()), "node2": None}
    report = report_for(nodes=nodes, parity=parity_result(cluster, {}))
    assert report["messages"] == [
        "node2: parity: the stack could not be read: could not read the stack facts: [Errno 13] Permission denied"
    ]


def test_ignore_patterns_move_findings_out_of_the_verdict():
    nodes = clean_nodes()
    nodes["node2"]["marker"] = {"msg": "file not found: /m"}
    report = report_for(nodes=nodes, ignore=[r"^checkpoint node2 "])
    assert report["drifted"] is False
    assert report["summary"]["ignored"] == 1
    assert report["ignored"][0]["title"] == "no checkpoint marker at /data/m/.kimi-checkpoint.json"
    assert "(1 ignored by drift_ignore)" in render_table(report)


def test_markdown_has_every_finding_with_diff_and_fix_and_survives_backticks():
    records = recorded()
    report = report_for(records=records, run_id=RECORDED_RUN_ID, run={"rc": 2}, hosts=["node1", "node2", "node3"])
    text = render_markdown(report)
    assert text.startswith("# Kimi K2 cluster drift: DRIFT\n")
    assert "## Cluster and converge run" in text
    assert "## node1 (node rank 0)" in text
    assert "- **edited**: edited by hand: <tmp>/root/node1/etc/kimi/nccl.env (environment file)" in text
    assert "  -NCCL_SOCKET_IFNAME=eth1" in text
    assert "## Notes (not drift)" in text
    fenced = report_for(
        records=[
            *clean_records()[:1],
            {
                "kind": "change",
                "host": "node1",
                "task": "t",
                "action": "copy",
                "path": "/etc/kimi/vllm.env",
                "diff": [{"before": "A=```\n", "after": "A=1\n", "before_header": "/etc/kimi/vllm.env"}],
            },
            clean_records()[1],
        ]
    )
    body = render_markdown(fenced)
    assert "  ````diff" in body


def test_the_json_report_is_plain_json():
    report = report_for()
    assert json.loads(report_json(report))["schema"] == 1


# ------------------------------------------------------------------------------------------- replicas


def two_replica_report() -> dict:
    """Replica a (node1) clean; replica b (node2 rank 0, node3 rank 1) with two findings, both on node3."""
    nodes = clean_nodes()
    nodes["node3"] = {
        "marker": {"msg": "file not found: /data/m/.kimi-checkpoint.json"},
        "units": {
            "rc": 0,
            "stdout": "Id=kimi-vllm-headless.service\nLoadState=loaded\nActiveState=failed\nSubState=failed\n",
        },
        "health": {"skipped": True},
    }
    nodes["node2"] = {**clean_nodes()["node1"]}
    nodes["node1"] = {**clean_nodes()["node1"]}
    return report_for(
        hosts=["node1", "node2", "node3"],
        ranks={"node1": 0, "node2": 0, "node3": 1},
        replica_of=replica_by_host({"a": ["node1"], "b": ["node2", "node3"]}),
        records=[clean_records()[0], {"kind": "stats", "hosts": {}}],
        nodes=nodes,
    )


def test_replica_by_host_inverts_the_replicas_filter_and_keeps_a_twice_named_host_in_its_first():
    assert replica_by_host({"a": ["node1", "node2"], "b": ["node2", "node3"]}) == {
        "node1": "a",
        "node2": "a",
        "node3": "b",
    }
    assert replica_by_host({}) == {}


def test_two_replicas_one_drifted_name_the_replica_its_hosts_and_counts():
    report = two_replica_report()
    assert report["drifted"] is True
    assert report["replicas"] == [
        {"name": "a", "hosts": ["node1"], "drifted": False, "hosts_drifted": [], "findings": 0, "by_kind": {}},
        {
            "name": "b",
            "hosts": ["node2", "node3"],
            "drifted": True,
            "hosts_drifted": ["node3"],
            "findings": 2,
            "by_kind": {"checkpoint": 1, "service": 1},
        },
    ]
    assert report["summary"]["replicas"] == 2
    assert report["summary"]["replicas_drifted"] == ["b"]
    assert [row["replica"] for row in report["hosts"]] == ["a", "b", "b"]
    # The messages keep their "<host>: <kind>: ..." lines: no replica line is added (the lab asserts on them).
    assert report["messages"] == [
        "node3: checkpoint: no checkpoint marker at /data/m/.kimi-checkpoint.json",
        "node3: service: kimi-vllm-headless.service is failed (failed)",
    ]
    assert json.loads(report_json(report))["replicas"][1]["hosts_drifted"] == ["node3"]


def test_two_replicas_get_a_replica_column_and_a_markdown_heading_each():
    report = two_replica_report()
    table = render_table(report).splitlines()
    assert table[0] == "DRIFT: 2 finding(s) on node3 (replica b)"
    assert table[2].split()[:3] == ["host", "replica", "rank"]
    assert [line.split()[:3] for line in table[4:]] == [["node1", "a", "0"], ["node2", "b", "0"], ["node3", "b", "1"]]
    text = render_markdown(report)
    assert "## Replica a: no drift\n\nhosts node1\n\n## Replica b: DRIFT\n" in text
    replica_b = text[text.index("## Replica b: DRIFT") :]
    assert replica_b.startswith(
        "## Replica b: DRIFT\n\nhosts node2, node3; 2 finding(s) on node3\n\n### node3 (node rank 1)\n\n"
        "- **checkpoint**: no checkpoint marker at /data/m/.kimi-checkpoint.json\n"
    )
    headings = [line for line in text.splitlines() if line.startswith("#")]
    assert headings == [
        "# Kimi K2 cluster drift: DRIFT",
        "## Replica a: no drift",
        "## Replica b: DRIFT",
        "### node3 (node rank 1)",
        "## Notes (not drift)",
    ]


def test_a_clean_two_replica_report_counts_its_replicas():
    report = report_for(replica_of={"node1": "a", "node2": "b"})
    assert report["summary"]["replicas_drifted"] == []
    assert [group["drifted"] for group in report["replicas"]] == [False, False]
    assert render_table(report).splitlines()[0] == "no drift on 2 host(s) in 2 replica(s)"


def test_one_replica_reads_as_before_whatever_its_name():
    nodes = clean_nodes()
    nodes["node2"]["marker"] = {"msg": "file not found: /m"}
    unnamed = report_for(nodes=nodes)
    named = report_for(nodes=nodes, replica_of={"node1": "a", "node2": "a"})
    assert unnamed["replicas"] == [
        {
            "name": "default",
            "hosts": ["node1", "node2"],
            "drifted": True,
            "hosts_drifted": ["node2"],
            "findings": 1,
            "by_kind": {"checkpoint": 1},
        }
    ]
    assert named["replicas"][0]["name"] == "a"
    for report in (unnamed, named):
        table = render_table(report).splitlines()
        assert table[0] == "DRIFT: 1 finding(s) on node2"
        assert table[2].split()[:2] == ["host", "rank"]
        text = render_markdown(report)
        assert "## node2 (node rank 1)\n\n- **checkpoint**: no checkpoint marker" in text
        assert "Replica" not in text
    assert render_markdown(named) == render_markdown(unnamed)


def test_a_host_in_no_replica_is_listed_as_such():
    nodes = clean_nodes()
    nodes["node2"]["health"] = {"status": 503, "url": "u"}
    report = report_for(nodes=nodes, replica_of={"node1": "a"})
    assert [(group["name"], group["hosts"], group["findings"]) for group in report["replicas"]] == [
        ("a", ["node1"], 0),
        (None, ["node2"], 1),
    ]
    assert report["summary"]["replicas"] == 1
    assert report["summary"]["replicas_drifted"] == []
    assert render_table(report).splitlines()[5].split()[:3] == ["node2", "no", "replica"]
    assert "## In no replica: DRIFT\n\nhosts node2; 1 finding(s) on node2\n\n### node2 (node rank 1)" in (
        render_markdown(report)
    )


# ------------------------------------------------------------------------------------ the callback's helpers


def callback_module():
    path = REPO / "plugins" / "callback" / "kimi_drift_changes.py"
    spec = importlib.util.spec_from_file_location("kimi_drift_changes_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_callback_classifies_skips_by_why_they_were_skipped():
    callback = callback_module()
    assert callback.classify_result({"skip_reason": "Conditional result was False"}, skipped=True) is None
    assert callback.classify_result({"skipped_reason": "No items in the list"}, skipped=True) is None
    assert callback.classify_result({"msg": "Command would have run if not in check mode"}, skipped=True) == "would_run"
    assert (
        callback.classify_result({"msg": "remote module (x) does not support check mode"}, skipped=True) == "unchecked"
    )
    assert callback.classify_result({"changed": True}) == "change"
    assert callback.classify_result({"changed": False}) is None


def test_callback_keeps_nothing_of_a_censored_result_but_its_file():
    callback = callback_module()
    censored = {"censored": "the output has been hidden", "changed": True, "_ansible_no_log": True}
    fields = callback.content_fields(
        censored, "change", {"dest": "/etc/kimi/vllm-secrets.env", "content": "KEY=s3cret"}
    )
    assert fields == {"censored": True, "path": "/etc/kimi/vllm-secrets.env"}
    failed = callback.content_fields({"_ansible_no_log": True, "msg": "s3cret", "stderr": "s3cret"}, "failed")
    assert failed == {"censored": True}


def test_callback_cuts_huge_diffs_and_normalises_diff_shapes():
    callback = callback_module()
    huge = "x" * (callback.MAX_TEXT + 10)
    (entry,) = callback.diffs_of({"diff": {"before": huge, "after": "", "unknown": 1}})
    assert entry["before"].endswith("[... cut: 10 more characters]\n")
    assert "unknown" not in entry
    assert len(callback.diffs_of({"diff": [{"prepared": "p"}, "junk", {"before": "a", "after": "b"}]})) == 2


# ----------------------------------------------------------------------------------------------- module


def module_args(tmp_path: Path, **overrides) -> dict:
    changes = tmp_path / "drift-20260101T000000Z.converge.jsonl"
    changes.write_text("".join(json.dumps(r) + "\n" for r in clean_records()))
    args = {
        "hosts": ["node1", "node2"],
        "ranks": {"node1": 0, "node2": "1"},
        "changes_file": str(changes),
        "run_id": "r1",
        "converge": {"rc": 0, "stdout_tail": [], "stderr_tail": []},
        "parity": {"ok": True, "failures": [], "parity_warnings": []},
        "nodes": clean_nodes(),
        "checkpoint": CHECKPOINT,
        "report_dir": str(tmp_path / "reports"),
        "stamp": "20260101T000000Z",
    }
    args.update(overrides)
    return args


def test_module_writes_the_reports_and_the_latest_copies(tmp_path):
    ok, result = run_module(tmp_path, "kimi_drift_report", module_args(tmp_path))
    assert ok, result
    assert result["changed"] is False
    assert result["drifted"] is False
    reports = tmp_path / "reports"
    assert sorted(p.name for p in reports.iterdir()) == [
        "drift-20260101T000000Z.json",
        "drift-20260101T000000Z.md",
        "drift-latest.json",
        "drift-latest.md",
    ]
    data = json.loads((reports / "drift-latest.json").read_text())
    assert data["generated_at"] == "2026-01-01T00:00:00Z"
    assert data["converge"]["complete"] is True
    assert (reports / "drift-latest.md").read_text() == (reports / "drift-20260101T000000Z.md").read_text()
    assert result["table"].splitlines()[0] == "no drift on 2 host(s)"


def test_module_reports_drift_without_failing_and_writes_in_check_mode(tmp_path):
    nodes = clean_nodes()
    nodes["node1"]["health"] = {"status": 500, "url": "http://127.0.0.1:8000/health"}
    ok, result = run_module(tmp_path, "kimi_drift_report", module_args(tmp_path, nodes=nodes), check=True)
    assert ok, result
    assert result["drifted"] is True
    assert result["messages"] == ["node1: health: http://127.0.0.1:8000/health answered 500, not 200"]
    assert Path(result["report_paths"]["markdown"]).is_file()


def test_module_reports_per_replica_from_the_replicas_filter(tmp_path):
    nodes = clean_nodes()
    nodes["node2"]["marker"] = {"msg": "file not found: /m"}
    replicas = {"a": ["node1"], "b": ["node2"]}
    ok, result = run_module(tmp_path, "kimi_drift_report", module_args(tmp_path, nodes=nodes, replicas=replicas))
    assert ok, result
    assert [(group["name"], group["drifted"], group["findings"]) for group in result["replicas"]] == [
        ("a", False, 0),
        ("b", True, 1),
    ]
    assert result["messages"] == ["node2: checkpoint: no checkpoint marker at /data/m/.kimi-checkpoint.json"]
    markdown = Path(result["report_paths"]["markdown"]).read_text()
    assert "## Replica b: DRIFT\n\nhosts node2; 1 finding(s) on node2\n" in markdown
    data = json.loads(Path(result["report_paths"]["json"]).read_text())
    assert data["replicas"][1]["hosts_drifted"] == ["node2"]
    ok, result = run_module(tmp_path, "kimi_drift_report", module_args(tmp_path, replicas={"a": "node1"}))
    assert not ok
    assert "replicas must map each replica name to its list of hosts" in result["msg"]


def test_module_without_replicas_reports_one_default_replica(tmp_path):
    ok, result = run_module(tmp_path, "kimi_drift_report", module_args(tmp_path))
    assert ok, result
    assert [(group["name"], group["hosts"]) for group in result["replicas"]] == [("default", ["node1", "node2"])]


def test_module_keeps_only_the_newest_reports(tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    for stamp in ("20250101T000000Z", "20250102T000000Z", "20250103T000000Z"):
        for suffix in (".json", ".md", ".converge.jsonl"):
            (reports / f"drift-{stamp}{suffix}").write_text("{}")
    (reports / "parity.json").write_text("{}")
    ok, result = run_module(tmp_path, "kimi_drift_report", module_args(tmp_path, keep=2))
    assert ok, result
    names = sorted(p.name for p in reports.iterdir())
    assert "parity.json" in names
    assert [n for n in names if n.startswith("drift-2025")] == [
        "drift-20250103T000000Z.converge.jsonl",
        "drift-20250103T000000Z.json",
        "drift-20250103T000000Z.md",
    ]
    assert sorted(result["pruned"])[0] == "drift-20250101T000000Z.converge.jsonl"


def test_module_refuses_a_bad_stamp_or_pattern(tmp_path):
    ok, result = run_module(tmp_path, "kimi_drift_report", module_args(tmp_path, stamp="yesterday"))
    assert not ok
    assert "stamp must look like" in result["msg"]
    ok, result = run_module(tmp_path, "kimi_drift_report", module_args(tmp_path, ignore=["(unclosed"]))
    assert not ok
    assert "is not a regular expression" in result["msg"]


def test_a_firewall_rule_removed_by_hand_is_named_in_the_finding():
    record = {
        "kind": "changed",
        "host": "node2",
        "action": "kimi_nftables",
        "role": "firewall",
        "task": "Keep table inet kimi loaded as the rules file says (a rule changed by hand is a change)",
        "msg": "rule missing: meta l4proto 6 reject with tcp reset (chain input)",
    }
    assert classify(record) == "firewall"
    finding = change_finding(record)
    assert finding.line().startswith("node2: converge: firewall: rule missing: meta l4proto 6 reject")
    assert "firewall : Keep table inet kimi loaded" in finding.title


def test_each_replica_is_judged_by_its_own_layout():
    # Replica a runs mp (node2 must run the headless unit), replica b runs ray (node4, a Ray worker, runs no vLLM
    # unit): one run-wide layout would call b's worker a missing headless rank, or miss a's.
    nodes = clean_nodes()
    no_unit = {"rc": 0, "stdout": "Id=kimi-vllm-headless.service\nLoadState=not-found\nActiveState=inactive\n"}
    nodes["node3"] = {**clean_nodes()["node1"], "layout": "ray"}
    nodes["node4"] = {**clean_nodes()["node2"], "units": no_unit, "layout": "ray"}
    nodes["node2"] = {**clean_nodes()["node2"], "units": no_unit, "layout": "mp"}
    report = report_for(
        hosts=["node1", "node2", "node3", "node4"],
        ranks={"node1": 0, "node2": 1, "node3": 0, "node4": 1},
        replica_of=replica_by_host({"a": ["node1", "node2"], "b": ["node3", "node4"]}),
        nodes=nodes,
    )
    assert [m.split(":")[0] for m in report["messages"]] == ["node2"], report["messages"]
    units = {row["host"]: row["unit"] for row in report["hosts"]}
    assert units["node2"] == "kimi-vllm-headless.service" and units["node4"] is None
