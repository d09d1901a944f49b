#!/usr/bin/python
"""Ansible module: the nccl-tests launcher command for the cluster, and the verdict on what a run printed."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_nccl_tests
short_description: Render the all_reduce_perf launcher command, or parse and judge a run's output
description:
  - I(mode=render) builds the launcher argv from the hosts in node order and their addresses. C(mpirun) runs
    once on node rank 0 (C(-np) nodes x processes per node, C(-H addr:slots,...), MPI's TCP and out-of-band
    traffic on I(interface), C(-x NAME=VALUE) for every NCCL variable); C(torchrun) runs on every node with its
    node rank. The NCCL variables are those of I(env_file_text) (the nccl role's file) that start with
    C(NCCL_), then C(NCCL_DEBUG=INFO) and C(NCCL_DEBUG_SUBSYS=INIT,NET), then I(extra_env). Fails, naming the
    role variable, when the inputs cannot run.
  - I(mode=judge) parses I(text) (nccl-tests' header, rank lines, table and footer, and NCCL's INFO lines) into
    a summary (transport IB, RoCE or Socket, GPUDirect RDMA, NCCL versions per host, ranks, wrong elements, average and
    maximum bus bandwidth) and fails listing every problem against the gates.
  - Pure computation; changes nothing, so check mode returns the same answer.
options:
  mode:
    description: What to do.
    type: str
    required: true
    choices: [render, judge]
  launcher:
    description: C(nccl_tests_launcher) (render).
    type: str
    choices: [mpirun, torchrun]
    default: mpirun
  hosts:
    description: The hosts of C(kimi_nodes) in node-rank order (render).
    type: list
    elements: str
  host_addresses:
    description: Host to the address the other nodes reach it on (render).
    type: dict
    default: {}
  gpus_per_node:
    description: GPUs per node (render).
    type: int
    default: 8
  binary:
    description: all_reduce_perf (mpirun) or the torch benchmark script (torchrun) (render).
    type: str
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
    description: Path of mpirun or torchrun.
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
    description: Wrap the launcher in C(timeout) with this many seconds (render); in judge, the limit that exit
      status 124 means.
    type: int
    default: 0
  text:
    description: The run's output, stdout and stderr of every launcher process (judge).
    type: str
  rc:
    description: The launcher's exit status (judge); non-zero is a problem.
    type: int
  min_busbw_gbs:
    description: Minimum average bus bandwidth in GB/s; 0 reports only (judge).
    type: float
    default: 0
  require_transport:
    description: Transport NCCL must use (judge); RDMA accepts IB or RoCE; empty accepts any.
    type: str
    choices: ["", IB, RoCE, RDMA]
    default: ""
  require_gdrdma:
    description: Fail unless the NET channels use GPUDirect RDMA (judge).
    type: bool
    default: false
  expected_nccl_version:
    description: The NCCL every rank must report (X.Y.Z, or a Debian version such as 2.30.7-1+cuda13.3); empty
      skips the check (judge).
    type: str
    default: ""
  nccl_source:
    description: What the expected version is the pin of, for the message (judge).
    type: str
    default: libnccl2
  expected_ranks:
    description: Ranks the run must list; 0 skips the check (judge).
    type: int
    default: 0
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.reads_only
"""

EXAMPLES = r"""
- name: Render the mpirun command for every GPU of kimi_nodes
  kimi_nccl_tests:
    mode: render
    launcher: mpirun
    hosts: "{{ kimi_topology.hosts_by_rank }}"
    host_addresses: {gn-h100-node1: 10.20.0.11, gn-h100-node2: 10.20.0.12}
    gpus_per_node: 8
    binary: /opt/nccl-tests/2.19.6/build-nccl2.30.7-1+cuda13.3/all_reduce_perf
    env_file_text: "{{ (nccl_env.content | b64decode) }}"
    interface: ib0
  delegate_to: localhost
  run_once: true

- name: Judge the run
  kimi_nccl_tests:
    mode: judge
    text: "{{ run.stdout }}\n{{ run.stderr }}"
    rc: "{{ run.rc }}"
    min_busbw_gbs: 350
    require_transport: IB
    expected_nccl_version: 2.30.7-1+cuda13.3
    expected_ranks: 16
"""

RETURN = r"""
commands:
  description: Host to the argv it runs (render).
  returned: mode is render
  type: dict
  sample: {"gn-h100-node1": ["mpirun", "-np", "16", "-H", "10.20.0.11:8,10.20.0.12:8"]}
command_lines:
  description: The same, shell-quoted for reading (render).
  returned: mode is render
  type: dict
run_on:
  description: The hosts that run a command (render); node rank 0 alone for mpirun, every node for torchrun.
  returned: mode is render
  type: list
env:
  description: The variables every rank gets (render); the process environment for torchrun.
  returned: mode is render
  type: dict
processes:
  description: Processes the launch starts in all (render).
  returned: mode is render
  type: int
summary:
  description: The parsed run (judge).
  returned: mode is judge
  type: dict
problems:
  description: Every problem against the gates (judge); empty when the run passed.
  returned: mode is judge
  type: list
report:
  description: A few lines for a person (judge).
  returned: mode is judge
  type: list
passed:
  description: Whether the run passed every gate (judge).
  returned: mode is judge
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule

try:  # installed as the kimi.k2 collection
    from ansible_collections.kimi.k2.plugins.module_utils.kimi_nccl_tests import (
        LaunchSpec,
        NcclTestsInputError,
        judge,
        launch_env,
        parse_env_file,
        parse_output,
        render,
        report_lines,
    )
except ImportError:  # run from the repository (ansible.cfg: module_utils = plugins/module_utils)
    from ansible.module_utils.kimi_nccl_tests import (
        LaunchSpec,
        NcclTestsInputError,
        judge,
        launch_env,
        parse_env_file,
        parse_output,
        render,
        report_lines,
    )

ARGUMENT_SPEC = {
    "mode": {"type": "str", "required": True, "choices": ["render", "judge"]},
    "launcher": {"type": "str", "choices": ["mpirun", "torchrun"], "default": "mpirun"},
    "hosts": {"type": "list", "elements": "str"},
    "host_addresses": {"type": "dict", "default": {}},
    "gpus_per_node": {"type": "int", "default": 8},
    "binary": {"type": "str"},
    "min_bytes": {"type": "str", "default": "1M"},
    "max_bytes": {"type": "str", "default": "4G"},
    "step_factor": {"type": "int", "default": 2},
    "gpus_per_process": {"type": "int", "default": 1},
    "iters": {"type": "int", "default": 20},
    "warmup_iters": {"type": "int", "default": 5},
    "check_iters": {"type": "int", "default": 1},
    "env_file_text": {"type": "str", "default": ""},
    "extra_env": {"type": "dict", "default": {}},
    "interface": {"type": "str", "default": ""},
    "launcher_path": {"type": "str", "default": ""},
    "launcher_args": {"type": "list", "elements": "str", "default": []},
    "test_args": {"type": "list", "elements": "str", "default": []},
    "master_port": {"type": "int", "default": 29611},
    "allow_run_as_root": {"type": "bool", "default": False},
    "timeout_s": {"type": "int", "default": 0},
    "text": {"type": "str"},
    "rc": {"type": "int"},
    "min_busbw_gbs": {"type": "float", "default": 0},
    "require_transport": {"type": "str", "choices": ["", "IB", "RoCE", "RDMA"], "default": ""},
    "require_gdrdma": {"type": "bool", "default": False},
    "expected_nccl_version": {"type": "str", "default": ""},
    "nccl_source": {"type": "str", "default": "libnccl2"},
    "expected_ranks": {"type": "int", "default": 0},
}


def _render(module: AnsibleModule) -> None:
    params = module.params
    if not params["hosts"] or not params["binary"]:
        module.fail_json(msg="mode render needs hosts and binary")
    spec = LaunchSpec(
        launcher=params["launcher"],
        hosts_by_rank=params["hosts"],
        host_addresses={str(host): str(address) for host, address in params["host_addresses"].items()},
        gpus_per_node=params["gpus_per_node"],
        binary=params["binary"],
        min_bytes=params["min_bytes"],
        max_bytes=params["max_bytes"],
        step_factor=params["step_factor"],
        gpus_per_process=params["gpus_per_process"],
        iters=params["iters"],
        warmup_iters=params["warmup_iters"],
        check_iters=params["check_iters"],
        env=launch_env(parse_env_file(params["env_file_text"]), params["extra_env"]),
        interface=params["interface"],
        launcher_path=params["launcher_path"],
        launcher_args=params["launcher_args"],
        test_args=params["test_args"],
        master_port=params["master_port"],
        allow_run_as_root=params["allow_run_as_root"],
        timeout_s=params["timeout_s"],
    )
    try:
        rendered = render(spec)
    except NcclTestsInputError as error:
        module.fail_json(msg=str(error), variable=error.variable)
    module.exit_json(changed=False, **rendered)


def _judge(module: AnsibleModule) -> None:
    params = module.params
    if params["text"] is None:
        module.fail_json(msg="mode judge needs text")
    summary = parse_output(params["text"])
    problems = judge(
        summary,
        params["min_busbw_gbs"],
        params["require_transport"],
        params["expected_nccl_version"],
        rc=params["rc"],
        expected_ranks=params["expected_ranks"],
        require_gdrdma=params["require_gdrdma"],
        nccl_source=params["nccl_source"],
        timeout_s=params["timeout_s"],
    )
    report = report_lines(summary, problems, params["min_busbw_gbs"])
    result = {"summary": summary, "problems": problems, "report": report, "passed": not problems}
    if problems:
        module.fail_json(msg="nccl-tests failed: " + "; ".join(problems), **result)
    module.exit_json(changed=False, msg=report[-1], **result)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    if module.params["mode"] == "render":
        _render(module)
    else:
        _judge(module)


if __name__ == "__main__":
    main()
