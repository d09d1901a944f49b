"""The drift recorder on a task that writes several files in one module run (kimi.k2.kimi_files): one record per
file it changed, each with that file's diff, classified like a template's; a no_log one names only its files."""

from __future__ import annotations

import importlib.util
import sys
from types import SimpleNamespace

from ansible_collections.kimi.k2.plugins.module_utils.kimi_drift_record import classify

from tests.ansible_run import REPO_ROOT

spec = importlib.util.spec_from_file_location(
    "kimi_drift_changes", REPO_ROOT / "plugins" / "callback" / "kimi_drift_changes.py"
)
recorder = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = recorder
spec.loader.exec_module(recorder)

UNIT = "/etc/systemd/system/kimi-vllm.service"
ENV = "/etc/kimi/vllm.env"
CHECK_MODE_RESULT = {
    "changed": True,
    "changed_paths": ["/etc/kimi", UNIT, ENV],
    "diff": [
        {"before": {"path": "/etc/kimi", "state": "absent"}, "after": {"path": "/etc/kimi", "state": "directory"}},
        {"before_header": UNIT, "after_header": UNIT, "before": "[Service]\n", "after": "[Service]\nRestart=always\n"},
        {"after_header": ENV, "before": "", "after": "VLLM_HOST_IP=198.18.0.11\n"},
        {"before": {"path": ENV, "mode": "0600"}, "after": {"path": ENV, "mode": "0644"}},
    ],
}


def records(data: dict, args: dict | None = None) -> list[dict]:
    task = SimpleNamespace(_role=None, resolved_action="kimi.k2.kimi_files", action="kimi.k2.kimi_files")
    result = SimpleNamespace(
        result=data,
        task=task,
        task_name="Write this node's vLLM environment and unit",
        host=SimpleNamespace(get_name=lambda: "node1"),
        task_fields={"args": args or {}},
    )
    callback = recorder.CallbackModule.__new__(recorder.CallbackModule)
    callback._play = "Serve"
    return list(callback._item_records(result))


def test_one_record_per_changed_file_with_its_own_diff_and_class():
    found = {record["path"]: record for record in records(CHECK_MODE_RESULT)}
    assert list(found) == ["/etc/kimi", UNIT, ENV]
    assert classify(found[UNIT]) == "unit_file" and classify(found[ENV]) == "env_file"
    assert classify(found["/etc/kimi"]) == "file"
    assert [entry["after"] for entry in found[UNIT]["diff"]] == ["[Service]\nRestart=always\n"]
    assert len(found[ENV]["diff"]) == 2  # its content (it is missing) and its mode
    assert all(record["kind"] == "change" and record["item"] is None for record in found.values())


def test_a_censored_result_names_its_files_and_nothing_else():
    censored = {"censored": "the output has been hidden", "changed": True}
    args = {"files": [{"dest": "/etc/prometheus/alertmanager.yml", "content": "secret"}]}
    (record,) = records(censored, args)
    assert record["censored"] is True and record["path"] == "/etc/prometheus/alertmanager.yml"
    assert "diff" not in record and "secret" not in str(record)


def test_an_unchanged_result_records_nothing():
    assert records({"changed": False, "changed_paths": []}) == []
