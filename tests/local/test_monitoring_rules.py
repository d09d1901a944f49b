"""The monitoring role's alert rules, rendered by Ansible with the role's own defaults (tests/fixtures/monitoring/
render.yml), pass `promtool check rules`, and every rule passes its `promtool test rules` cases in
tests/fixtures/monitoring/*.test.yml: it fires when it should and stays silent on the healthy series.

promtool is Debian 12's, the version the role installs (`make promtool`; `make local` gets it first).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.ansible_run import REPO_ROOT, run_playbook
from tests.promtool import promtool

MONITORING = REPO_ROOT / "tests" / "fixtures" / "monitoring"
RENDER = MONITORING / "render.yml"
RULES_NAME = "kimi-alerts.rules.yml"
LATENCY_ALERTS = {"KimiVllmTtftP99High", "KimiVllmTpotP99High"}

# case -> extra vars. The promtool cases assume "objectives": TTFT p99 2 s, TPOT p99 0.1 s, the rest defaults.
CASES = {
    "objectives": {"kimi_slo_ttft_p99_ms": 2000, "kimi_slo_tpot_p99_ms": 100},
    # No objectives: no latency alert. The drift age written another way must come out the same seconds.
    "no-objectives": {"kimi_slo_ttft_p99_ms": 0, "kimi_slo_tpot_p99_ms": 0, "monitoring_alert_drift_max_age": "1d12h"},
}


def _inventory(directory: Path) -> Path:
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    path = directory / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": local}}}))
    return path


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, Path]:
    files = {}
    for case, extra in CASES.items():
        directory = tmp_path_factory.mktemp(case)
        destination = directory / RULES_NAME
        outcome = run_playbook(
            RENDER, _inventory(directory), extravars={**extra, "monitoring_rules_render_dest": str(destination)}
        )
        assert outcome.rc == 0, f"{case}: {outcome.failure_messages()}"
        files[case] = destination
    return files


def _alerts(path: Path) -> dict[str, dict]:
    document = yaml.safe_load(path.read_text())
    return {rule["alert"]: rule for group in document["groups"] for rule in group["rules"] if "alert" in rule}


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool()), *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("case", CASES)
def test_the_rendered_rules_pass_promtool_check(rendered, case):
    checked = _promtool("check", "rules", str(rendered[case]), cwd=rendered[case].parent)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(_alerts(rendered[case]))} rules found" in checked.stdout


def test_every_rule_passes_its_promtool_cases(rendered, tmp_path):
    shutil.copy(rendered["objectives"], tmp_path / RULES_NAME)
    tests = sorted(MONITORING.glob("*.test.yml"))
    for test in tests:
        shutil.copy(test, tmp_path / test.name)
    result = _promtool("test", "rules", *(test.name for test in tests), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(tests), result.stdout


def test_every_alert_has_a_case_where_it_fires_and_one_where_it_is_silent(rendered):
    firing, silent = set(), set()
    for test_file in MONITORING.glob("*.test.yml"):
        for case in yaml.safe_load(test_file.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else silent).add(check["alertname"])
    alerts = set(_alerts(rendered["objectives"]))
    assert alerts - firing == set(), "alerts no promtool case sees firing"
    assert alerts - silent == set(), "alerts no promtool case sees silent"
    assert (firing | silent) - alerts == set(), "cases for alerts the rules do not have"


def test_without_objectives_the_latency_alerts_are_not_rendered(rendered):
    with_objectives, without = _alerts(rendered["objectives"]), _alerts(rendered["no-objectives"])
    assert set(with_objectives) - set(without) == LATENCY_ALERTS
    assert set(without) <= set(with_objectives)
    assert with_objectives["KimiVllmTtftP99High"]["expr"].rstrip().endswith("> 2.0")
    assert with_objectives["KimiVllmTpotP99High"]["expr"].rstrip().endswith("> 0.1")


def test_the_drift_age_is_written_in_seconds_whatever_its_spelling(rendered):
    for case in CASES:  # 36h (the default) and 1d12h
        assert _alerts(rendered[case])["KimiDriftStale"]["expr"].endswith("> 129600"), case
