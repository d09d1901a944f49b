#!/usr/bin/python
"""Ansible module: the verdict on what an nccl-tests run printed, against the site's gates."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_nccl_tests_result
short_description: Parse an all_reduce_perf run's output and judge it against the gates
description:
  - Parses I(text) (nccl-tests' header, rank lines, table and footer, and NCCL's INFO lines) into a summary
    (transport IB, RoCE or Socket, GPUDirect RDMA, NCCL versions per host, ranks, wrong elements, average and
    maximum bus bandwidth).
  - Fails listing every problem against the gates (exit status, an unfinished run, wrong data, the rank count,
    the bandwidth floor, the transport, GPUDirect RDMA, the NCCL version); the summary, problems and report are
    returned either way.
  - Pure computation; changes nothing, so check mode returns the same answer.
options:
  text:
    description: The run's output, stdout and stderr of every launcher process (the output of the command
      M(kimi.k2.kimi_nccl_tests_command) renders).
    type: str
    required: true
  rc:
    description: The launcher's exit status; non-zero is a problem, 124 means I(timeout_s) was reached.
    type: int
  min_busbw_gbs:
    description: Minimum average bus bandwidth in GB/s; 0 reports only.
    type: float
    default: 0
  require_transport:
    description: Transport NCCL must use; RDMA accepts IB or RoCE; empty accepts any.
    type: str
    choices: ["", IB, RoCE, RDMA]
    default: ""
  require_gdrdma:
    description: Fail unless the NET channels use GPUDirect RDMA.
    type: bool
    default: false
  expected_nccl_version:
    description: The NCCL every rank must report (X.Y.Z, or a Debian version such as 2.30.7-1+cuda13.3); empty
      skips the check.
    type: str
    default: ""
  nccl_source:
    description: What the expected version is the pin of, for the message.
    type: str
    default: libnccl2
  expected_ranks:
    description: Ranks the run must list; 0 skips the check.
    type: int
    default: 0
  timeout_s:
    description: The time limit the run had (C(nccl_tests_timeout)), named in the message when I(rc) is 124.
    type: int
    default: 0
  json_text:
    description:
      - The file nccl-tests wrote with C(-J) (its JSON format version 2). When given, the table, the footer and
        the NCCL library version come from it (unrounded figures; C(summary.table_source) is C(json)); the
        transport and versions still come from NCCL's lines in I(text). A file that cannot be read leaves the
        printed table in use, with a warning saying why.
    type: str
    default: ""
seealso:
  - module: kimi.k2.kimi_nccl_tests_command
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.reads_only
"""

EXAMPLES = r"""
- name: Judge the run
  kimi_nccl_tests_result:
    text: "{{ run.stdout }}\n{{ run.stderr }}"
    rc: "{{ run.rc }}"
    min_busbw_gbs: 350
    require_transport: IB
    expected_nccl_version: 2.30.7-1+cuda13.3
    expected_ranks: 16
    timeout_s: 1800
  delegate_to: localhost
  run_once: true
  register: nccl_tests_verdict
  # Write the reports first, then fail on nccl_tests_verdict.passed.
  failed_when: false
"""

RETURN = r"""
summary:
  description: The parsed run (program, rank_count, hosts, rows, avg_busbw, max_busbw, transport,
    transports_by_host, gdrdma, nccl_versions, wrong, out_of_bounds, failures, warnings, ...).
  returned: always
  type: dict
  sample: {"transport": "IB", "gdrdma": true, "rank_count": 16, "avg_busbw": 275.615, "wrong": 0}
problems:
  description: Every problem against the gates; empty when the run passed.
  returned: always
  type: list
  elements: str
  sample: ["avg bus bandwidth 9.01 GB/s is below nccl_tests_min_busbw_gbs 350"]
report:
  description: A few lines for a person; the last one is the verdict.
  returned: always
  type: list
  elements: str
  sample: ["NCCL 2.30.7; transport IB, GPUDirect RDMA on 64 of 64 NET channels", "passed (min avg busbw 250 GB/s)"]
passed:
  description: Whether the run passed every gate.
  returned: always
  type: bool
  sample: true
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_nccl_tests_verdict import verdict

ARGUMENT_SPEC = {
    "text": {"type": "str", "required": True},
    "rc": {"type": "int"},
    "min_busbw_gbs": {"type": "float", "default": 0},
    "require_transport": {"type": "str", "choices": ["", "IB", "RoCE", "RDMA"], "default": ""},
    "require_gdrdma": {"type": "bool", "default": False},
    "expected_nccl_version": {"type": "str", "default": ""},
    "nccl_source": {"type": "str", "default": "libnccl2"},
    "expected_ranks": {"type": "int", "default": 0},
    "timeout_s": {"type": "int", "default": 0},
    "json_text": {"type": "str", "default": ""},
}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    result = verdict(
        params["text"],
        params["rc"],
        min_busbw_gbs=params["min_busbw_gbs"],
        require_transport=params["require_transport"],
        require_gdrdma=params["require_gdrdma"],
        expected_nccl_version=params["expected_nccl_version"],
        nccl_source=params["nccl_source"],
        expected_ranks=params["expected_ranks"],
        timeout_s=params["timeout_s"],
        json_text=params["json_text"],
    )
    if result["problems"]:
        module.fail_json(msg="nccl-tests failed: " + "; ".join(result["problems"]), **result)
    module.exit_json(changed=False, msg=result["report"][-1], **result)


if __name__ == "__main__":
    main()
