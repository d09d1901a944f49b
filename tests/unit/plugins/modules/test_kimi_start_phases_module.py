"""kimi_start_phases as Ansible runs it on a node, under the node's bare /usr/bin/python3 where this machine has one,
with a fake systemctl and journalctl first on PATH: it asks systemctl for the unit's current invocation and start,
asks journalctl for that invocation's journal only, returns the milestones and phases of the lab's recorded start,
changes nothing (check mode too), and takes the start time only from the invocation it read."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.paths import FIXTURES
from tests.unit.ansible_adhoc import run_module

NODE_PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
RANK0 = FIXTURES / "journal" / "lab-0.32.0-cpu-rank0.journal.json"
HEADLESS = FIXTURES / "journal" / "lab-0.32.0-cpu-headless.journal.json"
INVOCATION = "74020a383d1f40d1a356bdc8a86fedd2"
UNIT = "kimi-vllm.service"


@pytest.fixture
def node(tmp_path, monkeypatch):
    """systemctl prints tmp_path/show, journalctl prints tmp_path/journal; both log their argv."""
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool, output in (("systemctl", "show"), ("journalctl", "journal")):
        (tools / tool).write_text(f'#!/bin/sh\necho "$@" >> "{tmp_path}/{tool}.argv"\ncat "{tmp_path}/{output}"\n')
        (tools / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    (tmp_path / "show").write_text(f"InvocationID={INVOCATION}\nExecMainStartTimestamp=@1796472966\n")
    (tmp_path / "journal").write_text(RANK0.read_text())
    return tmp_path


def start_phases(tmp_path, check: bool = False, **options) -> dict:
    ok, result = run_module(
        tmp_path, "kimi_start_phases", {"unit": UNIT, **options}, check=check, interpreter=NODE_PYTHON
    )
    assert ok, result.get("msg")
    assert result["changed"] is False
    return result


def test_the_current_start_of_the_unit_is_read_from_its_invocation_only_in_check_mode_too(node):
    for check in (False, True):
        result = start_phases(node, check=check, first_token_at=1796473092.5)
        assert result["invocation_id"] == INVOCATION
        milestones = result["milestones"]
        assert milestones["started"] == 1796472966.0  # ExecMainStartTimestamp wins over systemd's line
        assert milestones["group_formed"] == pytest.approx(1796473048.292)
        assert milestones["weights_loaded"] == pytest.approx(1796473049.828)
        assert milestones["compiled"] == pytest.approx(1796473062.487)
        assert milestones["engine_ready"] == pytest.approx(1796473082.594)
        assert milestones["api_up"] == pytest.approx(1796473089.633)
        assert milestones["graphs_captured"] is None
        assert milestones["first_token"] == 1796473092.5
        assert result["reported"]["init_engine_s"] == 30.08
        assert result["phases"][-1] == {"start": "api_up", "end": "first_token", "seconds": 2.867}
        assert result["workers"] == 1 and result["entries"] == 117
    argv = (node / "journalctl.argv").read_text().splitlines()
    assert argv[0] == f"-u {UNIT} _SYSTEMD_INVOCATION_ID={INVOCATION} -o json --no-pager --quiet"
    assert (node / "systemctl.argv").read_text().splitlines()[0] == (
        f"show -p InvocationID -p ExecMainStartTimestamp --timestamp=unix {UNIT}"
    )


def test_an_earlier_invocation_gets_no_start_time_from_the_current_one_and_no_line_of_another_start(node):
    # journalctl here prints two starts (a fake that ignores the match); the module keeps the one asked for.
    (node / "journal").write_text(RANK0.read_text() + HEADLESS.read_text())
    (node / "show").write_text("InvocationID=0123456789abcdef0123456789abcdef\nExecMainStartTimestamp=@1796479000\n")
    result = start_phases(node, invocation_id="97f14d1ee3814b38a505526f2512072a")
    assert result["invocation_id"] == "97f14d1ee3814b38a505526f2512072a"
    # systemd's "Started" line of that invocation, not the current invocation's ExecMainStartTimestamp.
    assert result["milestones"]["started"] == pytest.approx(1796472964.908)
    assert result["milestones"]["group_formed"] == pytest.approx(1796473048.303)
    assert result["milestones"]["api_up"] is None  # rank 0's API line belongs to the other start
    assert result["reported"]["loading_weights_s"] == 0.07


def test_a_unit_that_never_started_fails_with_a_reason(node):
    (node / "show").write_text("InvocationID=\nExecMainStartTimestamp=\n")
    ok, result = run_module(node, "kimi_start_phases", {"unit": UNIT}, interpreter=NODE_PYTHON)
    assert not ok
    assert "has no invocation" in result["msg"]


def test_a_journal_that_is_not_json_fails_naming_the_line(node):
    (node / "journal").write_text(json.dumps({"MESSAGE": "a"}) + "\nnot json\n")
    ok, result = run_module(node, "kimi_start_phases", {"unit": UNIT}, interpreter=NODE_PYTHON)
    assert not ok
    assert "line 2 is not JSON" in result["msg"]
