#!/usr/bin/python
"""Ansible module: every metric name the alert rules and dashboards select is on the running vLLM's /metrics."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_metrics_check
short_description: Check that the alert rules and dashboards only select metric names the running vLLM exports
description:
  - Runs on the controller (C(delegate_to localhost)), where the rule files and dashboards are. Takes the text
    of rank 0's C(/metrics) (the verify role fetches it on rank 0), reads the metric names of its C(# TYPE)
    lines and samples, and the metric names every PromQL expression of I(rule_files) (Prometheus rule files, or
    their Jinja templates) and of I(dashboard_files) (Grafana dashboard JSON, every panel target's C(expr)) selects.
  - A name starting with I(prefix) that the page does not offer is missing; a rule on it never fires, a panel on
    it stays empty, and neither says so. Counters count under their C(_total) name and histograms under
    C(_bucket), C(_sum) and C(_count), so C(vllm:num_preemptions) is missing where C(vllm:num_preemptions_total)
    is there.
  - Fails naming each missing metric with the file and the rule or panel using it, unless I(fail_on_missing) is
    false; then C(check) says the same for the verify report.
options:
  metrics:
    description: The /metrics answer (Prometheus text exposition format).
    type: str
    required: true
  rule_files:
    description: Prometheus rule files or their Jinja templates (Jinja is left out before reading).
    type: list
    elements: path
    default: []
  dashboard_files:
    description: Grafana dashboard JSON files.
    type: list
    elements: path
    default: []
  prefix:
    description: Only names starting with this are judged (others come from other exporters).
    type: str
    default: "vllm:"
  fail_on_missing:
    description: Fail when a name is missing (false - return the verdict in C(check) and C(missing) only).
    type: bool
    default: true
notes:
  - Reads files on the controller only; it changes nothing.
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.reads_only
"""

EXAMPLES = r"""
- name: Check the monitoring role's rules and dashboard against rank 0's /metrics
  kimi_metrics_check:
    metrics: "{{ verify_metrics_page.content }}"
    rule_files: ["{{ role_path }}/../monitoring/templates/kimi-alerts.rules.yml.j2"]
    dashboard_files: ["{{ role_path }}/../monitoring/files/grafana/kimi-vllm.json"]
  delegate_to: localhost
"""

RETURN = r"""
used:
  description: The names starting with I(prefix) the rules and dashboards select, sorted.
  returned: always
  type: list
  elements: str
  sample: ["vllm:kv_cache_usage_perc", "vllm:num_preemptions_total"]
missing:
  description: Each use of a missing name - name, source (the file) and where (the rule or panel).
  returned: always
  type: list
  elements: dict
  sample: [{name: "vllm:gpu_cache_usage_perc", source: "rules.yml", where: "alert KvCacheHigh (group kimi-vllm)"}]
messages:
  description: One line per missing use.
  returned: always
  type: list
  elements: str
check:
  description: The verdict as a verify report check - name C(metric_names), status (pass or fail) and detail.
  returned: always
  type: dict
"""

from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_metrics import (
    dashboard_file_expressions,
    describe_missing,
    metric_uses,
    missing_metrics,
    parse_exposition,
    rule_expressions,
)

CHECK_NAME = "metric_names"


def read_expressions(module: AnsibleModule) -> list:
    """Every expression of the rule files and dashboards; fails naming a file that cannot be read or parsed."""
    expressions = []
    readers = [(path, rule_expressions) for path in module.params["rule_files"]]
    readers += [(path, dashboard_file_expressions) for path in module.params["dashboard_files"]]
    for path, reader in readers:
        try:
            expressions += reader(Path(path).read_text(encoding="utf-8"), path)
        except (OSError, ValueError, AttributeError) as error:
            # ValueError covers json's and yaml's parse errors; AttributeError a file of the wrong shape.
            module.fail_json(msg=f"could not read the expressions of {path}: {error}")
    return expressions


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "metrics": {"type": "str", "required": True},
            "rule_files": {"type": "list", "elements": "path", "default": []},
            "dashboard_files": {"type": "list", "elements": "path", "default": []},
            "prefix": {"type": "str", "default": "vllm:"},
            "fail_on_missing": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    params = module.params
    exposition = parse_exposition(params["metrics"])
    uses = metric_uses(read_expressions(module))
    prefix = params["prefix"]
    used = sorted({use.name for use in uses if use.name.startswith(prefix)})
    if not exposition.series_names():
        # An error page or an empty answer would otherwise make every name "missing" for the wrong reason.
        missing, messages = [], ["the /metrics text holds no metric at all"]
    else:
        missing_uses = missing_metrics(uses, exposition, prefix)
        missing = [{"name": use.name, "source": use.source, "where": use.where} for use in missing_uses]
        messages = describe_missing(missing_uses)
    ok = not messages
    detail = f"{len(used)} {prefix} names used by the rules and dashboards, all exported" if ok else "; ".join(messages)
    result = {
        "changed": False,
        "used": used,
        "missing": missing,
        "messages": messages,
        "check": {"name": CHECK_NAME, "status": "pass" if ok else "fail", "detail": detail},
    }
    if not ok and params["fail_on_missing"]:
        module.fail_json(msg=f"metric names the running vLLM does not export: {detail}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
