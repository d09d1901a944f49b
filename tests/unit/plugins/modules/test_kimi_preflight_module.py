"""kimi_preflight as Ansible runs it: the verdict written through the one report writer (sorted JSON, atomic, the
same bytes not rewritten) and never a change; a failing node fails the module with its sentence."""

from __future__ import annotations

import json
from dataclasses import asdict

from tests.unit.ansible_adhoc import run_module
from tests.unit.plugins.module_utils.test_kimi_preflight import h100_gpu_facts, h100_node_facts, nvidia_requirements


def args(report, node=None) -> dict:
    return {
        "requirements": asdict(nvidia_requirements()),
        "hosts": {"gn1": {"host_ip": "10.20.0.11", "ports": {"8000": "API"}}},
        "node_facts": {"gn1": node or h100_node_facts()},
        "gpu_facts": {"gn1": h100_gpu_facts()},
        "report_path": str(report),
    }


def test_the_report_is_sorted_json_written_once_and_never_a_change(tmp_path):
    report = tmp_path / "preflight.json"
    ok, result = run_module(tmp_path, "kimi_preflight", args(report))
    assert ok, result
    assert result["changed"] is False and result["passed"] is True
    text = report.read_text()
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"
    written = report.stat().st_mtime_ns

    ok, result = run_module(tmp_path, "kimi_preflight", args(report))
    assert ok and result["changed"] is False
    assert report.stat().st_mtime_ns == written, "the same verdict was written again"
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".preflight.json.")]


def test_a_failing_node_fails_with_its_sentence_and_still_writes_the_report(tmp_path):
    report = tmp_path / "preflight.json"
    node = h100_node_facts()
    node["shm"] = {"total_bytes": 1024}
    ok, result = run_module(tmp_path, "kimi_preflight", args(report, node))
    assert not ok
    assert result["msg"].startswith("preflight failed: gn1: shm")
    assert json.loads(report.read_text())["passed"] is False
