"""kimi_report_file as Ansible runs it: one report (plan.json, serve.json, nccl_tests.json/.log) written through
the one report writer (sorted JSON, atomic, the same bytes not rewritten, the directory made), never a change,
and nothing at all written in check mode (drift's check-mode converge must leave the controller as it was)."""

from __future__ import annotations

import json

from tests.unit.ansible_adhoc import run_module

PLAN = {"fits": True, "kv_tokens": 466032, "reasons": [], "layout": {"tp": 8, "pp": 2}, "name": "Kimi-K2 \u2013 H100"}


def leftovers(directory) -> list[str]:
    """Temporary files of an atomic write that were not renamed away."""
    return [p.name for p in directory.iterdir() if p.name.startswith(".")]


def test_json_is_written_sorted_into_a_new_directory_and_is_never_a_change(tmp_path):
    report = tmp_path / "artifacts" / "nested" / "plan.json"
    ok, result = run_module(tmp_path, "kimi_report_file", {"path": str(report), "json": PLAN})
    assert ok, result
    assert result["changed"] is False and result["written"] is True and result["path"] == str(report)
    # kimi_report's JSON: sorted keys, an indent of 2, a final newline, the same value read back.
    assert report.read_text() == json.dumps(PLAN, indent=2, sort_keys=True) + "\n"
    assert json.loads(report.read_text()) == PLAN
    assert oct(report.stat().st_mode & 0o777) == "0o644"
    assert not leftovers(report.parent)


def test_the_same_report_is_not_written_again_and_a_new_one_replaces_it(tmp_path):
    report = tmp_path / "serve.json"
    assert run_module(tmp_path, "kimi_report_file", {"path": str(report), "json": PLAN})[1]["written"] is True
    before = report.stat().st_mtime_ns

    ok, result = run_module(tmp_path, "kimi_report_file", {"path": str(report), "json": PLAN})
    assert ok and result["changed"] is False and result["written"] is False
    assert report.stat().st_mtime_ns == before, "the same bytes were written again"

    ok, result = run_module(tmp_path, "kimi_report_file", {"path": str(report), "json": [{**PLAN, "fits": False}]})
    assert ok and result["changed"] is False and result["written"] is True
    assert json.loads(report.read_text())[0]["fits"] is False


def test_text_is_written_as_given(tmp_path):
    report = tmp_path / "nccl_tests.log"
    text = "==== node1 (exit status 0):\n  mpirun -np 16\n# Avg bus bandwidth    : 275.615 \n\n"
    ok, result = run_module(tmp_path, "kimi_report_file", {"path": str(report), "text": text})
    assert ok and result["changed"] is False and result["written"] is True
    assert report.read_text() == text


def test_check_mode_writes_nothing_and_makes_no_directory(tmp_path):
    directory = tmp_path / "artifacts"
    ok, result = run_module(
        tmp_path, "kimi_report_file", {"path": str(directory / "plan.json"), "json": PLAN}, check=True
    )
    assert ok, result
    assert result["changed"] is False and result["written"] is False
    assert result["path"] == str(directory / "plan.json")
    assert not directory.exists()

    # An existing report is left as it was, even when the new one differs.
    directory.mkdir()
    (directory / "plan.json").write_text("{}\n")
    ok, result = run_module(
        tmp_path, "kimi_report_file", {"path": str(directory / "plan.json"), "json": PLAN}, check=True
    )
    assert ok and result["written"] is False
    assert (directory / "plan.json").read_text() == "{}\n"


def test_json_text_instead_of_a_value_is_refused_naming_the_fix(tmp_path):
    report = tmp_path / "plan.json"
    ok, result = run_module(tmp_path, "kimi_report_file", {"path": str(report), "json": "fits: true"})
    assert not ok
    assert result["msg"].startswith("json must be a mapping or a list (got str)")
    assert not report.exists()


def test_exactly_one_of_json_and_text(tmp_path):
    report = str(tmp_path / "plan.json")
    ok, result = run_module(tmp_path, "kimi_report_file", {"path": report, "json": PLAN, "text": "x"})
    assert not ok and "mutually exclusive" in result["msg"]
    ok, result = run_module(tmp_path, "kimi_report_file", {"path": report})
    assert not ok and "one of the following is required: json, text" in result["msg"]


def test_a_directory_that_cannot_be_made_fails_naming_the_report(tmp_path):
    (tmp_path / "artifacts").write_text("a file where the directory should be")
    report = tmp_path / "artifacts" / "plan.json"
    ok, result = run_module(tmp_path, "kimi_report_file", {"path": str(report), "json": PLAN})
    assert not ok
    assert result["msg"].startswith(f"could not write the report {report}: ")
    assert result["written"] is False
