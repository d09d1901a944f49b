#!/usr/bin/python
"""Ansible module: judge every node's preflight facts and print one table (runs once, on the controller)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_preflight
short_description: Check every node's facts against what the deployment needs; one table, one verdict
description:
  - Runs once on the controller with the facts of all nodes (from M(kimi_node_info) and M(kimi_gpu_info)).
  - Produces a table with a row per node and a column per check (devices, driver, memory, shm, data_disk,
    interfaces, host_ip, ports, device_processes, apt_sources), writes it as JSON when I(report_path) is set, and
    fails with every failing cell (host, check, needed and found) unless all pass.
  - On CPU lab nodes (I(requirements.accelerator=cpu)) the GPU checks are replaced by CPU equivalents.
  - With I(requirements.offline_mirror_url) (an air-gapped site), apt_sources fails a node with any apt source
    (from M(kimi_node_info) with C(apt_sources=true)) that is not under that URL and not C(file:), naming the file
    and the URI; files in I(requirements.apt_sources_managed) are skipped. Without it the column is n/a.
options:
  requirements:
    description: What every node needs (the fields of plugins/module_utils/kimi_preflight.py's Requirements).
    type: dict
    required: true
    suboptions:
      accelerator:
        description: C(nvidia), or C(cpu) on CPU lab nodes (the GPU checks become CPU checks).
        type: str
        required: true
      gpus_per_node:
        description: GPUs (or, on C(cpu), ranks) each node must have.
        type: int
        required: true
      gpu:
        description: The GPU preset (nvidia) - the names nvidia-smi may print and the memory it reports.
        type: str
        default: ""
      model:
        description: The model preset - its published checkpoint size when I(data_required_bytes) is 0.
        type: str
        default: ""
      driver_version_prefix:
        description: The driver version every node must start with, e.g. C(580.) (nvidia, optional).
        type: str
        default: ""
      ram_gpu_factor:
        description: Warn when a node's RAM is below this factor times its total GPU memory (nvidia).
        type: float
        default: 2.0
      cpu_ram_per_rank_bytes:
        description: On C(cpu), the RAM each rank needs (KV cache and the process).
        type: int
        default: 0
      shm_min_bytes:
        description: The least /dev/shm a node must have.
        type: int
        default: 0
      data_required_bytes:
        description: The whole checkpoint's size; 0 takes the model preset's published size.
        type: int
        default: 0
      data_margin_bytes:
        description: Free space the data disk must have beyond the checkpoint.
        type: int
        default: 0
      interfaces:
        description: Network interfaces every node must have.
        type: list
        elements: str
        default: []
      own_units:
        description: Unit name patterns whose ports and GPU memory are ours (not another program's).
        type: list
        elements: str
        default: []
      offline_mirror_url:
        description: The air-gapped site's mirror, the one URL every apt source must be under; empty skips the
          apt sources check.
        type: str
        default: ""
      apt_sources_managed:
        description: Apt source files the converge itself points at the mirror (not judged).
        type: list
        elements: str
        default: []
  hosts:
    description: Per host, C(host_ip) (the node's VLLM_HOST_IP) and C(ports) (port number to purpose).
    type: dict
    required: true
  node_facts:
    description: Per host, the result of M(kimi_node_info).
    type: dict
    required: true
  gpu_facts:
    description: Per host, the result of M(kimi_gpu_info) (absent on CPU nodes).
    type: dict
    default: {}
  report_path:
    description: Where to write the JSON report on the controller (directory must exist).
    type: path
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.writes_reports
"""

EXAMPLES = r"""
- name: Judge preflight facts
  kimi_preflight:
    requirements: "{{ preflight_requirements }}"
    hosts: "{{ preflight_host_expectations }}"
    node_facts: "{{ preflight_node_facts }}"
    report_path: "{{ playbook_dir }}/../artifacts/preflight.json"
  run_once: true
  delegate_to: localhost
"""

RETURN = r"""
passed:
  description: Whether every cell is ok, warn or n/a.
  returned: always
  type: bool
failures:
  description: >-
    One sentence per failing cell, C(host: check: detail).
  returned: always
  type: list
notices:
  description: One sentence per warning cell (a concern that does not stop the play).
  returned: always
  type: list
table:
  description: Host to check to status and text.
  returned: always
  type: dict
summary_lines:
  description: The table as aligned text lines.
  returned: always
  type: list
"""

from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_preflight import HostExpectation, Requirements, evaluate
from ansible_collections.kimi.k2.plugins.module_utils.kimi_report import report_json, write_report_file

REQUIREMENTS_OPTIONS = {
    "accelerator": {"type": "str", "required": True},
    "gpus_per_node": {"type": "int", "required": True},
    "gpu": {"type": "str", "default": ""},
    "model": {"type": "str", "default": ""},
    "driver_version_prefix": {"type": "str", "default": ""},
    "ram_gpu_factor": {"type": "float", "default": 2.0},
    "cpu_ram_per_rank_bytes": {"type": "int", "default": 0},
    "shm_min_bytes": {"type": "int", "default": 0},
    "data_required_bytes": {"type": "int", "default": 0},
    "data_margin_bytes": {"type": "int", "default": 0},
    "interfaces": {"type": "list", "elements": "str", "default": []},
    "own_units": {"type": "list", "elements": "str", "default": []},
    "offline_mirror_url": {"type": "str", "default": ""},
    "apt_sources_managed": {"type": "list", "elements": "str", "default": []},
}


def expectations_from(hosts: dict) -> dict[str, HostExpectation]:
    return {
        host: HostExpectation(
            host_ip=str(spec.get("host_ip", "")),
            ports={int(port): str(purpose) for port, purpose in (spec.get("ports") or {}).items()},
        )
        for host, spec in hosts.items()
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            # Requirements' fields, with its defaults: a key left out gets the same value as before.
            "requirements": {"type": "dict", "required": True, "options": REQUIREMENTS_OPTIONS},
            # Keyed by inventory hostname, each value one host's expectation or facts (another module's result,
            # passed whole): free-form mappings, judged by kimi_preflight itself.
            "hosts": {"type": "dict", "required": True},
            "node_facts": {"type": "dict", "required": True},
            "gpu_facts": {"type": "dict", "default": {}},
            "report_path": {"type": "path"},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        requirements = Requirements(**params["requirements"])
    except TypeError as error:
        module.fail_json(msg=f"requirements: {error}")
    missing = sorted(set(params["hosts"]) - set(params["node_facts"]))
    if missing:
        module.fail_json(msg=f"no node facts for host(s) {', '.join(missing)} (unreachable or failed earlier)")
    verdict = evaluate(requirements, expectations_from(params["hosts"]), params["node_facts"], params["gpu_facts"])
    if params["report_path"]:
        # The one report writer: sorted JSON, written atomically, never a change.
        write_report_file(Path(params["report_path"]), report_json(verdict))
    if not verdict["passed"]:
        module.fail_json(msg="preflight failed: " + " | ".join(verdict["failures"]), **verdict)
    module.exit_json(changed=False, **verdict)


if __name__ == "__main__":
    main()
