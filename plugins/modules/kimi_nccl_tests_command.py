#!/usr/bin/python
"""Ansible module: the nccl-tests launcher command (mpirun or torchrun) for every GPU of the cluster."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_nccl_tests_command
short_description: Render the all_reduce_perf launcher command for every GPU of kimi_nodes
description:
  - Builds the launcher argv from the hosts in node order and their addresses. C(mpirun) runs once on node
    rank 0 (C(-np) nodes x processes per node, C(-H addr:slots,...), MPI's TCP and out-of-band traffic on
    I(interface), C(-x NAME=VALUE) for every NCCL variable); C(torchrun) runs on every node with its node rank.
  - The NCCL variables are those of I(env_file_text) (the nccl role's file) that start with C(NCCL_), then
    C(NCCL_DEBUG=INFO) and C(NCCL_DEBUG_SUBSYS=INIT,NET) (the lines M(kimi.k2.kimi_nccl_tests_result) reads),
    then I(extra_env).
  - Fails, naming the role variable in C(variable), when the inputs cannot run (no hosts, a host without an
    address, GPUs per process that do not divide GPUs per node, a bad size, an unusable variable name, ...).
  - Pure computation; changes nothing, so check mode returns the same answer.
options:
  launcher:
    description: C(nccl_tests_launcher).
    type: str
    choices: [mpirun, torchrun]
    default: mpirun
  hosts:
    description: The hosts of C(kimi_nodes) in node-rank order.
    type: list
    elements: str
    required: true
  host_addresses:
    description: Host to the address the other nodes reach it on (C(kimi_announced_ip) of each host).
    type: dict
    default: {}
  gpus_per_node:
    description: GPUs per node.
    type: int
    default: 8
  binary:
    description: all_reduce_perf (mpirun) or the torch benchmark script (torchrun).
    type: str
    required: true
  min_bytes:
    description: Smallest size, nccl-tests syntax (C(-b)).
    type: str
    default: 1M
  max_bytes:
    description: Largest size (C(-e)).
    type: str
    default: 4G
  step_factor:
    description: Size multiplier between rows (C(-f)).
    type: int
    default: 2
  gpus_per_process:
    description: GPUs per process (C(-g); mpirun only, torchrun runs one).
    type: int
    default: 1
  iters:
    description: Timed iterations per size (C(-n)).
    type: int
    default: 20
  warmup_iters:
    description: Untimed iterations first (C(-w)).
    type: int
    default: 5
  check_iters:
    description: Data-check iterations (C(-c)); 0 skips the check (the wrong-elements column then reads N/A).
    type: int
    default: 1
  env_file_text:
    description: The nccl role's environment file as text; its C(NCCL_*) variables reach every rank.
    type: str
    default: ""
  extra_env:
    description: Further variables for every rank; they win over the file and the debug settings.
    type: dict
    default: {}
  interface:
    description: The cluster interface (C(btl_tcp_if_include) and C(oob_tcp_if_include) for mpirun).
    type: str
    default: ""
  launcher_path:
    description: Path of mpirun or torchrun; empty runs the launcher's name.
    type: str
    default: ""
  launcher_args:
    description: Further launcher arguments, placed before the binary.
    type: list
    elements: str
    default: []
  test_args:
    description: Further test arguments, placed after the sizes.
    type: list
    elements: str
    default: []
  master_port:
    description: The rendezvous port on node rank 0 (torchrun).
    type: int
    default: 29611
  allow_run_as_root:
    description: Add C(--allow-run-as-root) (mpirun started by root).
    type: bool
    default: false
  timeout_s:
    description: Wrap the launcher in C(timeout --kill-after=30) with this many seconds; 0 runs without a limit.
    type: int
    default: 0
  json_path:
    description:
      - With mpirun, nccl-tests also writes its results as JSON to this absolute C(*.json) path on node rank 0
        (C(-J)); M(kimi.k2.kimi_nccl_tests_result) reads the figures from it. nccl-tests writes to C(PATH.0),
        C(PATH.1), ... when the file exists, so remove it before the run. Empty writes none.
    type: str
    default: ""
seealso:
  - module: kimi.k2.kimi_nccl_tests_result
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.reads_only
"""

EXAMPLES = r"""
- name: Render the mpirun command for every GPU of kimi_nodes
  kimi_nccl_tests_command:
    launcher: mpirun
    hosts: "{{ kimi_topology.hosts_by_rank }}"
    host_addresses: {gn-h100-node1: 10.20.0.11, gn-h100-node2: 10.20.0.12}
    gpus_per_node: 8
    binary: /opt/nccl-tests/2.19.6/build-nccl2.30.7-1+cuda13.3/all_reduce_perf
    env_file_text: "{{ (nccl_env.content | b64decode) }}"
    interface: ib0
    allow_run_as_root: true
    timeout_s: 1800
  delegate_to: localhost
  run_once: true
  register: nccl_tests_command

- name: Run it where it runs
  ansible.builtin.command:
    argv: "{{ nccl_tests_command.commands[inventory_hostname] }}"
  when: inventory_hostname in nccl_tests_command.run_on
"""

RETURN = r"""
launcher:
  description: The launcher the commands start.
  returned: success
  type: str
  sample: mpirun
commands:
  description: Host to the argv it runs.
  returned: success
  type: dict
  sample: {"gn-h100-node1": ["mpirun", "-np", "16", "-H", "10.20.0.11:8,10.20.0.12:8"]}
command_lines:
  description: The same, shell-quoted for reading.
  returned: success
  type: dict
  sample: {"gn-h100-node1": "mpirun -np 16 -H 10.20.0.11:8,10.20.0.12:8"}
run_on:
  description: The hosts that run a command; node rank 0 alone for mpirun, every node for torchrun.
  returned: success
  type: list
  elements: str
  sample: [gn-h100-node1]
env:
  description: The variables every rank gets (C(-x) for mpirun; the process environment for torchrun).
  returned: success
  type: dict
  sample: {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_IB_HCA": "mlx5"}
ranks:
  description: GPUs the run spans (nodes x GPUs per node), the rank count the result should see.
  returned: success
  type: int
  sample: 16
processes:
  description: Processes the launch starts in all.
  returned: success
  type: int
  sample: 16
variable:
  description: The role variable to fix.
  returned: failure, when the inputs cannot run
  type: str
  sample: nccl_tests_gpus_per_process
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_nccl_tests_launch import (
    NcclTestsInputError,
    launch_spec,
    render,
)

ARGUMENT_SPEC = {
    "launcher": {"type": "str", "choices": ["mpirun", "torchrun"], "default": "mpirun"},
    "hosts": {"type": "list", "elements": "str", "required": True},
    # Free-form: inventory hostname to address.
    "host_addresses": {"type": "dict", "default": {}},
    "gpus_per_node": {"type": "int", "default": 8},
    "binary": {"type": "str", "required": True},
    "min_bytes": {"type": "str", "default": "1M"},
    "max_bytes": {"type": "str", "default": "4G"},
    "step_factor": {"type": "int", "default": 2},
    "gpus_per_process": {"type": "int", "default": 1},
    "iters": {"type": "int", "default": 20},
    "warmup_iters": {"type": "int", "default": 5},
    "check_iters": {"type": "int", "default": 1},
    "env_file_text": {"type": "str", "default": ""},
    # Free-form: environment variable name to value.
    "extra_env": {"type": "dict", "default": {}},
    "interface": {"type": "str", "default": ""},
    "launcher_path": {"type": "str", "default": ""},
    "launcher_args": {"type": "list", "elements": "str", "default": []},
    "test_args": {"type": "list", "elements": "str", "default": []},
    "master_port": {"type": "int", "default": 29611},
    "allow_run_as_root": {"type": "bool", "default": False},
    "timeout_s": {"type": "int", "default": 0},
    "json_path": {"type": "str", "default": ""},
}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        rendered = render(launch_spec(module.params))
    except NcclTestsInputError as error:
        module.fail_json(msg=str(error), variable=error.variable)
    module.exit_json(changed=False, **rendered)


if __name__ == "__main__":
    main()
