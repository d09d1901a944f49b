"""The checkpoint modules run as Ansible runs them: kimi_checkpoint_info, _plan, _verify and _job.

The rules are tested in tests/unit/plugins/module_utils/test_kimi_checkpoint.py and the node-side work in
test_kimi_checkpoint_node.py; these pin each module's options and answers end to end.
"""

from __future__ import annotations

import hashlib
import json
import os

from ansible_collections.kimi.k2.plugins.module_utils import kimi_checkpoint as ck

from tests.unit.ansible_adhoc import run_module

SHA = "60877af7bde655c71406a1843bcc395afa52fb57"


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def test_verify_records_stats_and_info_finds_a_same_size_overwrite(tmp_path):
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    contents = {"config.json": b'{"a": 1}', "model.safetensors": bytes(range(256)) * 32}
    for name, data in contents.items():
        (checkpoint / name).write_bytes(data)
    files = [
        {"path": "config.json", "size": 8, "sha256": None, "git_oid": blob_id(contents["config.json"])},
        {
            "path": "model.safetensors",
            "size": 8192,
            "sha256": hashlib.sha256(contents["model.safetensors"]).hexdigest(),
        },
    ]
    ok, verified = run_module(tmp_path, "kimi_checkpoint_verify", {"dir": str(checkpoint), "files": files})
    assert ok and verified["ok"] and verified["hashed"] == 2 and verified["marker_version"] == ck.MARKER_VERSION
    marker = {"version": ck.MARKER_VERSION, "repo_id": "org/r", "revision": SHA, "include": [], "exclude": []}
    (checkpoint / ".kimi-checkpoint.json").write_text(json.dumps({**marker, "files": verified["files"]}))
    args = {"dir": str(checkpoint), "repo_id": "org/r", "revision": SHA, "sample_files": 1}
    ok, clean = run_module(tmp_path, "kimi_checkpoint_info", {**args, "sample_index": 1})
    assert ok and clean["matches"] and clean["stale"] == [] and clean["files_recorded"] == 2
    assert clean["sampled"] == ["model.safetensors"] and clean["sample_problems"] == []
    weights = checkpoint / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    with weights.open("r+b") as handle:  # dd conv=notrunc
        handle.seek(4096)
        handle.write(b"\xff" * 16)
    os.utime(weights, ns=(mtime + 10**9, mtime + 10**9))  # the write's new mtime, on any clock granularity
    ok, found = run_module(tmp_path, "kimi_checkpoint_info", {**args, "sample_index": 1})
    assert ok and found["matches"] and found["stale_paths"] == ["model.safetensors"]
    # A stale file is not hashed again by the sample; restoring the mtime hides it from the stat, not the hash.
    assert found["sampled"] == []
    os.utime(weights, ns=(mtime, mtime))
    ok, hidden = run_module(tmp_path, "kimi_checkpoint_info", {**args, "sample_index": 1})
    assert ok and hidden["stale"] == [] and hidden["sample_problems"][0].startswith("model.safetensors: sha256 differs")


def test_plan_repairs_in_check_mode_without_deleting_and_names_the_shortfall(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "short").write_bytes(b"z")
    args = {"dir": str(data), "files": [{"path": "short", "size": 4}], "repair": True, "host": "node1"}
    ok, result = run_module(tmp_path, "kimi_checkpoint_plan", args, check=True)
    assert ok and result["changed"] is True and result["removed"] == ["short"] and (data / "short").exists()
    ok, result = run_module(tmp_path, "kimi_checkpoint_plan", {**args, "margin_bytes": 1 << 62})
    assert ok and result["shortfall"].startswith("node1: ") and not (data / "short").exists()


def test_job_starts_attaches_and_reports_the_end(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    script = tmp_path / "kimi-checkpoint-download.sh"
    script.write_text(f"#!/bin/bash\necho $$ >{state}/download.pid\nsleep 1\necho 0 >{state}/download.rc\n")
    script.chmod(0o700)
    common = {"dir": str(tmp_path), "state_dir": str(state), "script": str(script), "launcher": "nohup"}
    ok, started = run_module(tmp_path, "kimi_checkpoint_job", {**common, "state": "started"})
    assert ok and started["changed"] is True
    ok, ended = run_module(tmp_path, "kimi_checkpoint_job", {**common, "state": "finished", "wait": 30})
    assert ok and ended["changed"] is False and ended["running"] is False and ended["exit_status"] == 0
    ok, stopped = run_module(tmp_path, "kimi_checkpoint_job", {**common, "state": "stopped"})
    assert ok and stopped["changed"] is False and stopped["stopped"] is False


def test_job_needs_its_script_and_state_dir(tmp_path):
    ok, result = run_module(tmp_path, "kimi_checkpoint_job", {"state": "started", "dir": str(tmp_path)})
    assert not ok and "script" in result["msg"] and "state_dir" in result["msg"]
