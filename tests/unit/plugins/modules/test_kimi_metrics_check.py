"""kimi_metrics_check through `ansible localhost -m`: the shipped rules and dashboard against a recorded page, a
rule on a name vLLM no longer exports, an answer that is no metrics page, check mode."""

from __future__ import annotations

from tests.paths import FIXTURES, REPO_ROOT
from tests.unit.ansible_adhoc import run_module

RULES = REPO_ROOT / "roles" / "monitoring" / "templates" / "kimi-alerts.rules.yml.j2"
DASHBOARD = REPO_ROOT / "roles" / "monitoring" / "files" / "grafana" / "kimi-vllm.json"
PAGE = (FIXTURES / "vllm" / "metrics-0.23.0.txt").read_text()

OLD_RULES = """groups:
  - name: legacy
    rules:
      - alert: KvCacheFull
        expr: vllm:gpu_cache_usage_perc > {{ threshold }}
      - alert: Preempting
        expr: rate(vllm:num_preemptions[5m]) > 0
"""


def test_the_shipped_rules_and_dashboard_pass_on_the_production_pin_s_page(tmp_path):
    ok, result = run_module(
        tmp_path,
        "kimi_metrics_check",
        {"metrics": PAGE, "rule_files": [str(RULES)], "dashboard_files": [str(DASHBOARD)]},
    )
    assert ok, result
    assert result["changed"] is False
    assert result["missing"] == []
    assert "vllm:kv_cache_usage_perc" in result["used"] and "vllm:num_preemptions_total" in result["used"]
    assert result["check"]["name"] == "metric_names" and result["check"]["status"] == "pass"


def test_a_rule_on_a_renamed_metric_fails_naming_the_metric_the_file_and_the_rule(tmp_path):
    rules = tmp_path / "legacy.rules.yml.j2"
    rules.write_text(OLD_RULES)
    ok, result = run_module(tmp_path, "kimi_metrics_check", {"metrics": PAGE, "rule_files": [str(rules)]})
    assert not ok
    assert result["messages"] == [
        f"vllm:gpu_cache_usage_perc: not exported, used by alert KvCacheFull (group legacy) in {rules}",
        f"vllm:num_preemptions: not exported, used by alert Preempting (group legacy) in {rules}",
    ]
    assert "vllm:gpu_cache_usage_perc" in result["msg"] and "vllm:num_preemptions:" in result["msg"]


def test_without_failing_the_verdict_is_a_failed_check_for_the_report_also_in_check_mode(tmp_path):
    rules = tmp_path / "legacy.rules.yml"
    rules.write_text(OLD_RULES)
    args = {"metrics": PAGE, "rule_files": [str(rules)], "fail_on_missing": False}
    ok, result = run_module(tmp_path, "kimi_metrics_check", args, check=True)
    assert ok, result
    assert result["check"]["status"] == "fail"
    assert [item["name"] for item in result["missing"]] == ["vllm:gpu_cache_usage_perc", "vllm:num_preemptions"]


def test_an_answer_that_is_no_metrics_page_fails_without_blaming_every_name(tmp_path):
    args = {"metrics": "Unauthorized\n", "rule_files": [str(RULES)]}
    ok, result = run_module(tmp_path, "kimi_metrics_check", args)
    assert not ok
    assert result["messages"] == ["the /metrics text holds no metric at all"]
    assert result["missing"] == []


def test_an_unreadable_file_is_named(tmp_path):
    ok, result = run_module(tmp_path, "kimi_metrics_check", {"metrics": PAGE, "dashboard_files": [str(tmp_path / "x")]})
    assert not ok
    assert str(tmp_path / "x") in result["msg"]
