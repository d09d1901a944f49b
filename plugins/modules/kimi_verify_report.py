#!/usr/bin/python
"""Ansible module: write the verify phase's report (JSON, Markdown, SVG chart) on the controller."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_verify_report
short_description: Write the verify report - JSON, Markdown and a latency chart - and return a table to print
description:
  - Runs on the controller (C(delegate_to localhost), C(run_once)). Takes the checks of M(kimi_verify_api) (and
    any other check in the same shape), the result of M(kimi_vllm_bench), the inputs and the cluster facts.
  - Writes I(basename).json (everything, per-request records included), I(basename).md (a checks table, the
    latency table p50/p90/p99, throughput, thresholds, errors, cluster facts) and I(basename).svg (the latency
    chart, TTFT and E2E per request; only when a load test ran) into I(report_dir), each atomically, then
    byte-for-byte copies named I(latest_basename).json/.md/.svg. Copies, not symlinks - an archived or uploaded
    artifacts directory keeps them.
  - The chart is SVG written with the standard library alone (the controller needs no plotting library); the
    same data gives the same bytes. A browser opens it, and GitHub renders it where the Markdown links it.
  - Writes in check mode too - the files are controller artifacts, not managed state - and so never reports
    a change (the report writer every check shares, kimi_report).
  - Never fails because a check failed or a threshold was breached; C(ok) says so, and the play decides.
options:
  checks:
    description: Check results - name, status (or passed/skipped), detail, data.
    type: list
    elements: dict
    default: []
  rank_join:
    description:
      - The registered result of M(kimi_rank_join) (ok, summary, problems, ranks, nccl). It becomes the
        C(ranks_joined) check, after I(checks) - passed when every rank joined on one NCCL version, with the
        summary and each problem as its detail and the ranks and NCCL versions as its data.
      - A skipped result (the rank check was turned off) adds nothing.
    type: dict
  loadtest:
    description: The registered result of M(kimi_vllm_bench) (summary, records, breaches, sweep, thresholds); omit
      when no load test ran.
    type: dict
  thresholds:
    description: The limits applied; defaults to the C(thresholds) in I(loadtest).
    type: dict
  inputs:
    description: What the phase was asked (served_model_name, tool_choice, requests, concurrency, ...).
    type: dict
    default: {}
  facts:
    description: Cluster facts to record (nodes, layout, vLLM version, model revision, ...).
    type: dict
    default: {}
  started_at:
    description: When the phase started (UTC, ISO 8601), recorded next to generated_at.
    type: str
  report_dir:
    description: Directory for the files (created when missing).
    type: path
    required: true
  basename:
    description: File name without suffix; defaults to C(verify-<UTC time>), e.g. C(verify-20250131T120000Z).
    type: str
  latest_basename:
    description: Name of the copies of the newest report; empty writes none.
    type: str
    default: verify-latest
  chart:
    description: Draw the latency chart (I(basename).svg). C(png) is its former name.
    type: bool
    default: true
    aliases: [png]
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.writes_reports
"""

EXAMPLES = r"""
- name: Write the verify report
  kimi_verify_report:
    checks: "{{ verify_api.checks }}"
    rank_join: "{{ verify_ranks }}"
    loadtest: "{{ verify_load }}"
    inputs:
      served_model_name: kimi-k2
      concurrency: 8
    facts:
      nodes: "{{ groups.kimi_nodes | length }}"
    report_dir: "{{ kimi_report_dir }}"
  delegate_to: localhost
  run_once: true
  register: verify_report

- name: Show the verify table and where the SVG chart is
  ansible.builtin.debug:
    msg: "{{ verify_report.table + ['chart: ' ~ (verify_report.paths.chart | default('not drawn'))] }}"
  run_once: true

- name: Write the checks only, without the chart
  kimi_verify_report:
    checks: "{{ verify_api.checks }}"
    report_dir: "{{ kimi_report_dir }}"
    chart: false
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
ok:
  description: No check failed and no threshold was breached.
  returned: always
  type: bool
verdict:
  description: PASS, or FAIL with the counts.
  returned: always
  type: str
  sample: FAIL (1 check failed)
paths:
  description: json, markdown, chart (the SVG, when drawn) and latest_json, latest_markdown, latest_chart.
  returned: always
  type: dict
  sample:
    json: artifacts/verify-20250131T120000Z.json
    markdown: artifacts/verify-20250131T120000Z.md
    chart: artifacts/verify-20250131T120000Z.svg
    latest_json: artifacts/verify-latest.json
    latest_markdown: artifacts/verify-latest.md
    latest_chart: artifacts/verify-latest.svg
table:
  description: Fixed-width lines to print at the end of the play.
  returned: always
  type: list
  elements: str
"""

from datetime import UTC, datetime
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_verify_report import (
    build_report,
    default_basename,
    rank_join_check,
    render_table,
    utc_timestamp,
    verdict,
    write_report,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "checks": {"type": "list", "elements": "dict", "default": []},
            # Registered results of other modules (passed whole), and what the report records as given: suboptions
            # would add every key left out as null to the written report.
            "rank_join": {"type": "dict"},
            "loadtest": {"type": "dict"},
            "thresholds": {"type": "dict"},
            "inputs": {"type": "dict", "default": {}},
            "facts": {"type": "dict", "default": {}},
            "started_at": {"type": "str"},
            "report_dir": {"type": "path", "required": True},
            "basename": {"type": "str"},
            "latest_basename": {"type": "str", "default": "verify-latest"},
            "chart": {"type": "bool", "default": True, "aliases": ["png"]},
        },
        supports_check_mode=True,
    )
    params = module.params
    now = datetime.now(UTC)
    loadtest = params["loadtest"]
    if loadtest and loadtest.get("skipped"):
        loadtest = None  # kimi_vllm_bench skipped in check mode: there is nothing to report
    thresholds = params["thresholds"] if params["thresholds"] is not None else (loadtest or {}).get("thresholds")
    ranks = rank_join_check(params["rank_join"])
    report = build_report(
        params["checks"] + ([ranks] if ranks else []),
        loadtest,
        thresholds=thresholds,
        inputs=params["inputs"],
        facts=params["facts"],
        generated_at=utc_timestamp(now),
        started_at=params["started_at"],
    )
    basename = params["basename"] or default_basename(now)
    try:
        paths = write_report(report, Path(params["report_dir"]), basename, params["latest_basename"], params["chart"])
    except (OSError, ValueError) as error:
        module.fail_json(msg=f"could not write the verify report to {params['report_dir']}: {error}")
    table = render_table(report)
    table.append(f"report: {paths['markdown']}")
    module.exit_json(changed=False, ok=report["ok"], verdict=verdict(report), paths=paths, table=table, msg=table[0])


if __name__ == "__main__":
    main()
