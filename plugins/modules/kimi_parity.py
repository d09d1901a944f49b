#!/usr/bin/python
"""Ansible module: compare every node's stack facts with each other and with the pins; fail with the fixes."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_parity
short_description: Prove that every node runs the same pinned GPU software stack
description:
  - Runs once, on the controller, over the C(kimi_stack) facts of all nodes (from M(kimi_stack_facts)).
  - Compares every item across nodes and against the pins given here, namely the pinned debs and their holds,
    every other reported deb, the driver, fabric manager (which must equal that node's driver version
    exactly), GPU model and count, CUDA toolkit and runtime, the vLLM venv, its Python and every wheel in
    it, the NCCL vLLM loads (its version, read from the library) and where it comes from, every NCCL
    environment value, and whether each interface the NCCL environment names exists on the node, is up
    and has an IPv4 address. Kernel and OS differences are warnings.
  - An item with a pin must equal the pin; an item without one must be the same on every node (the most
    common value is the reference; on a tie, the first host's).
  - Fails with a table (a row per item, a column per host, differing values marked with C(!)) and, for
    each difference, the node, the item, both values and the exact command that fixes it.
  - Writes the whole comparison as JSON to I(report_path) (deterministic, so an unchanged cluster rewrites no
    byte). The report is the check's output, not managed state, so the module never reports a change. In
    check mode the comparison runs and nothing is written.
options:
  facts:
    description:
      - Host name to that host's C(kimi_stack) facts. Hosts are compared in this order unless I(hosts) is
        given.
    type: dict
  facts_dir:
    description: A directory of C(<host>.json) files holding facts, instead of I(facts).
    type: path
  hosts:
    description: Node order (e.g. C(groups.kimi_nodes)); the first host wins ties. Hosts missing from the facts fail.
    type: list
    elements: str
  deb_pins:
    description: Debian package name to the exact version every node must have.
    type: dict
    default: {}
  hold_debs:
    description: Every pinned deb must also be held (apt-mark hold).
    type: bool
    default: true
  wheel_pins:
    description: Wheel (distribution) name to the version the vLLM venv must have (the resolved pin set).
    type: dict
    default: {}
  wheel_overrides:
    description:
      - Wheels installed after the resolve with C(--no-deps), on purpose, at a version other than the
        resolve's (the NCCL-wheel override). They win over I(wheel_pins) and are labelled as overrides.
    type: dict
    default: {}
  driver_version:
    description: The exact driver version every node must run. Without it, drivers only have to agree.
    type: str
  cuda_version:
    description: CUDA toolkit version every node must have; C(13.3) accepts C(13.3.0).
    type: str
  nccl_version:
    description:
      - The NCCL version vLLM must load. Defaults to the nvidia-nccl-cu13 override or pin.
    type: str
  venv_python:
    description: Python version of the vLLM venv; C(3.12) accepts C(3.12.3).
    type: str
  nccl_env:
    description: NCCL environment values every node must have (other values only have to agree).
    type: dict
    default: {}
  per_host_env_keys:
    description: Environment keys that differ per node by design and are not compared.
    type: list
    elements: str
    default: [VLLM_HOST_IP]
  require_fabric_manager:
    description: Fail where a node with a driver has no fabric manager (NVSwitch systems need one).
    type: bool
    default: false
  compare_all_wheels:
    description: Compare every wheel in the venv across nodes, not only the pinned ones.
    type: bool
    default: true
  report_path:
    description: Where to write the JSON report (its directory must exist).
    type: path
  fail_on_mismatch:
    description: Fail when any node differs. With C(false) the result carries ok=false instead.
    type: bool
    default: true
  table_max_hosts:
    description: Host columns shown in the table; further hosts fold into one column (the JSON has them all).
    type: int
    default: 12
notes:
  - Runs on the controller (C(delegate_to localhost), C(run_once)); it does not contact the nodes.
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
attributes:
  check_mode:
    support: full
    details: In check mode the comparison runs and the report file is not written.
  diff_mode:
    support: none
    details: The report's content is in the result (C(table), C(failures)), not in a diff.
"""

EXAMPLES = r"""
- name: Gather every node's stack
  kimi_stack_facts:
    venv_path: /opt/vllm/current

- name: Prove parity across all nodes
  kimi_parity:
    facts: "{{ dict(groups.kimi_nodes | zip(groups.kimi_nodes | map('extract', hostvars, 'kimi_stack'))) }}"
    hosts: "{{ groups.kimi_nodes }}"
    deb_pins:
      libnccl2: "2.30.7-1+cuda13.3"
      libnccl-dev: "2.30.7-1+cuda13.3"
    wheel_pins: "{{ kimi_resolved_wheels }}"
    wheel_overrides: {}
    nccl_env:
      NCCL_SOCKET_IFNAME: "{{ kimi_network_interface }}"
    report_path: "{{ kimi_report_dir }}/parity.json"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
ok:
  description: Whether every node matched (warnings do not count).
  returned: always
  type: bool
summary:
  description: hosts, items, items_differing, failures, warnings.
  returned: always
  type: dict
failures:
  description: One per difference - host, item, label, value, expected, expected_from, fix, message.
  returned: always
  type: list
  elements: dict
  sample:
    - host: node2
      item: deb:libnccl2
      value: 2.30.5-1+cuda13.3
      expected: 2.30.7-1+cuda13.3
      fix: >-
        on node2: apt-get install -y --allow-change-held-packages libnccl2=2.30.7-1+cuda13.3
        && apt-mark hold libnccl2
parity_warnings:
  description: Differences that do not fail parity (kernel, OS), same keys as failures.
  returned: always
  type: list
  elements: dict
table:
  description: The text table (a row per item, a column per host, ! marks a difference).
  returned: success (on failure it is part of msg)
  type: str
report_path:
  description: Where the JSON report was written (not written in check mode).
  returned: when report_path is set
  type: str
"""

import json
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_parity import (
    Pins,
    compare,
    render_table,
    report_json,
    summary_message,
)
from ansible_collections.kimi.k2.plugins.module_utils.kimi_report import write_report_file

PIN_OPTIONS = {
    "deb_pins": "debs",
    "hold_debs": "hold_debs",
    "wheel_pins": "wheels",
    "wheel_overrides": "wheel_overrides",
    "driver_version": "driver_version",
    "cuda_version": "cuda_version",
    "nccl_version": "nccl_version",
    "venv_python": "venv_python",
    "nccl_env": "nccl_env",
    "per_host_env_keys": "per_host_env_keys",
    "require_fabric_manager": "require_fabric_manager",
    "compare_all_wheels": "compare_all_wheels",
}


def load_facts_dir(directory: Path) -> dict:
    """<host>.json files; a file may hold the facts themselves or a module result with ansible_facts."""
    facts = {}
    for path in sorted(directory.glob("*.json")):
        data = json.loads(path.read_text())
        data = data.get("ansible_facts", data)
        facts[path.stem] = data.get("kimi_stack", data)
    return facts


def ordered(facts: dict, hosts: list[str] | None) -> dict:
    if not hosts:
        return facts
    return {host: facts.get(host) for host in hosts}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            # Free-form: inventory hostname to that host's kimi_stack_facts result (passed whole).
            "facts": {"type": "dict"},
            "facts_dir": {"type": "path"},
            "hosts": {"type": "list", "elements": "str"},
            # The pins and overrides are package name to version, nccl_env variable name to value: free-form.
            "deb_pins": {"type": "dict", "default": {}},
            "hold_debs": {"type": "bool", "default": True},
            "wheel_pins": {"type": "dict", "default": {}},
            "wheel_overrides": {"type": "dict", "default": {}},
            "driver_version": {"type": "str"},
            "cuda_version": {"type": "str"},
            "nccl_version": {"type": "str"},
            "venv_python": {"type": "str"},
            "nccl_env": {"type": "dict", "default": {}},
            "per_host_env_keys": {"type": "list", "elements": "str", "default": ["VLLM_HOST_IP"]},
            "require_fabric_manager": {"type": "bool", "default": False},
            "compare_all_wheels": {"type": "bool", "default": True},
            "report_path": {"type": "path"},
            "fail_on_mismatch": {"type": "bool", "default": True},
            "table_max_hosts": {"type": "int", "default": 12},
        },
        required_one_of=[("facts", "facts_dir")],
        mutually_exclusive=[("facts", "facts_dir")],
        supports_check_mode=True,
    )
    params = module.params
    try:
        facts = params["facts"] if params["facts"] is not None else load_facts_dir(Path(params["facts_dir"]))
        pins = Pins.from_dict({field: params[option] for option, field in PIN_OPTIONS.items()})
    except (OSError, ValueError) as error:
        module.fail_json(msg=f"could not read the parity inputs: {error}")
    if not facts:
        module.fail_json(msg="no host facts to compare")

    report = compare(ordered(facts, params["hosts"]), pins)
    table = render_table(report, params["table_max_hosts"])
    report["table"] = table
    result = {"ok": report["ok"], "summary": report["summary"], "failures": report["failures"]}
    result.update(parity_warnings=report["warnings"], table=table)
    if params["report_path"]:
        path = Path(params["report_path"])
        if not module.check_mode:
            try:
                write_report_file(path, report_json(report))
            except OSError as error:
                module.fail_json(msg=f"could not write {path}: {error}", **result)
        result["report_path"] = str(path)
    if not report["ok"] and params["fail_on_mismatch"]:
        del result["table"]  # the message carries it already
        module.fail_json(msg=summary_message(report, params["table_max_hosts"]), changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
