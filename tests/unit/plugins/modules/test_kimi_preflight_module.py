"""kimi_preflight as Ansible runs it: the verdict written through the one report writer (sorted JSON, atomic, the
same bytes not rewritten) and never a change; a failing node fails the module with its sentence. With an offline
mirror, the apt sources kimi_node_info read (a Debian 12 node's) fail the node naming the file and each URI."""

from __future__ import annotations

import json
from dataclasses import asdict

from tests.paths import FIXTURES
from tests.unit.ansible_adhoc import run_module
from tests.unit.plugins.module_utils.test_kimi_preflight import h100_gpu_facts, h100_node_facts, nvidia_requirements


def args(report, node=None, **requirements) -> dict:
    return {
        "requirements": asdict(nvidia_requirements(**requirements)),
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


def test_with_an_offline_mirror_the_apt_sources_kimi_node_info_read_fail_the_node(tmp_path):
    debian = FIXTURES / "apt_sources" / "debian-12"
    ok, read = run_module(
        tmp_path, "kimi_node_info", {"data_path": str(tmp_path), "apt_sources": True, "apt_etc_path": str(debian)}
    )
    assert ok, read.get("msg")
    node = {**h100_node_facts(), "apt_sources": read["apt_sources"]}
    report = tmp_path / "preflight.json"
    mirror = {"offline_mirror_url": "http://10.0.0.5:8081/", "apt_sources_managed": []}

    ok, result = run_module(tmp_path, "kimi_preflight", args(report, node, **mirror))
    assert not ok
    file = debian / "sources.list.d" / "debian.sources"
    assert result["msg"] == (
        f"preflight failed: gn1: apt_sources: {file} names http://deb.debian.org/debian (line 3),"
        " http://deb.debian.org/debian-security (line 10): remove or disable them: an air-gapped node's only apt"
        " source is the offline mirror http://10.0.0.5:8081/ (docs/air-gapped.md)"
    )
    assert result["summary_lines"][2].split()[-1] == "fail"
    assert json.loads(report.read_text())["table"]["gn1"]["apt_sources"]["status"] == "fail"

    # The same node with the distribution's file managed (as nvidia-cuda.sources is): nothing else is foreign.
    mirror["apt_sources_managed"] = [str(file)]
    ok, result = run_module(tmp_path, "kimi_preflight", args(report, node, **mirror))
    assert ok, result.get("msg")
    assert result["table"]["gn1"]["apt_sources"]["status"] == "ok"


def test_the_requirements_options_are_the_requirements_fields_with_their_defaults():
    """The typed suboptions fill a key left out with Requirements' own default, so the verdict is the one the
    dataclass gave before the options were typed."""
    from dataclasses import MISSING, fields

    from ansible_collections.kimi.k2.plugins.module_utils.kimi_preflight import Requirements
    from ansible_collections.kimi.k2.plugins.modules.kimi_preflight import REQUIREMENTS_OPTIONS

    assert [f.name for f in fields(Requirements)] == list(REQUIREMENTS_OPTIONS)
    for f in fields(Requirements):
        option = REQUIREMENTS_OPTIONS[f.name]
        if f.default is MISSING and f.default_factory is MISSING:
            assert option.get("required") is True, f.name
        else:
            default = f.default if f.default is not MISSING else f.default_factory()
            assert option["default"] == default, f.name


def test_a_requirement_given_as_a_string_is_converted_and_a_missing_one_takes_its_default(tmp_path):
    report = tmp_path / "preflight.json"
    arguments = args(report)
    arguments["requirements"]["gpus_per_node"] = str(arguments["requirements"]["gpus_per_node"])
    del arguments["requirements"]["shm_min_bytes"]
    ok, result = run_module(tmp_path, "kimi_preflight", arguments)
    # Typed, the option converts a string (what -e or a template may give) before Requirements sees it.
    assert ok, result
    assert result["passed"] is True
