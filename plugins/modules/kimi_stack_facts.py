#!/usr/bin/python
"""Ansible module: the pinned stack as it really is on one node, for the cross-node parity check."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_stack_facts
short_description: Gather the versions of the GPU software stack one node really runs
description:
  - Reads, without changing anything, every item the parity check compares across nodes.
  - Debian packages (the pinned NCCL debs plus whatever driver, fabric manager and CUDA toolkit packages
    are installed) with version and hold state, from C(dpkg-query) and C(apt-mark showhold).
  - The driver version (loaded kernel module, else nvidia-smi, else the driver deb), the GPUs nvidia-smi
    lists, and the fabric manager version (deb, and C(nv-fabricmanager --version) when present).
  - CUDA toolkit and runtime versions of every /usr/local/cuda-X.Y and which one /usr/local/cuda points at.
  - The vLLM venv's Python version and every installed distribution, read by the venv's own interpreter.
  - Which libnccl.so.2 vLLM would load (VLLM_NCCL_SO_PATH, else the nvidia-nccl-cu13 wheel next to
    torch, else the system's) and its real version, read by loading it and calling ncclGetVersion.
  - The NCCL environment file's values, and whether each interface it names exists on this node, is up and
    has an IPv4 address (NCCL_IB_HCA is checked against /sys/class/infiniband).
  - Kernel release, OS and the system Python.
  - Read-only; identical in check mode.
options:
  venv_path:
    description: The vLLM venv (its C(bin/python) is run to list packages). A missing venv is reported, not fatal.
    type: path
    default: /opt/vllm/current
  nccl_env_file:
    description: The environment file (KEY=VALUE) the vLLM units load NCCL and gloo settings from.
    type: path
    default: /etc/kimi/nccl.env
  deb_packages:
    description:
      - Package names or dpkg-query globs to report. Names that are not installed are reported as absent.
    type: list
    elements: str
    default: [libnccl2, libnccl-dev, "cuda-toolkit-[0-9]*", "nvidia-driver-[0-9]*", "nvidia-fabricmanager*"]
  vllm_nccl_so_path:
    description:
      - The VLLM_NCCL_SO_PATH the units set, when it is not in I(nccl_env_file). It wins over the wheel.
    type: path
  probe_nccl:
    description: Load the chosen libnccl.so.2 in a child Python and read its version with ncclGetVersion.
    type: bool
    default: true
notes:
  - Results are set as the fact C(kimi_stack); pass every node's C(kimi_stack) to M(kimi_parity).
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.reads_only
"""

EXAMPLES = r"""
- name: Read the stack every node really has
  kimi_stack_facts:
    venv_path: /opt/vllm/current
    nccl_env_file: /etc/kimi/nccl.env

- name: Show which NCCL vLLM would load here
  ansible.builtin.debug:
    msg: "{{ kimi_stack.nccl.path }} ({{ kimi_stack.nccl.source }}) is NCCL {{ kimi_stack.nccl.version }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to the host's variables.
  returned: always
  type: dict
  contains:
    kimi_stack:
      description:
        - schema, hostname, kernel, os, python (system).
        - debs, name to installed, version, held and status.
        - driver (version, source, gpus, nvidia_smi_version) and fabric_manager (package, version, deb_version, held).
        - cuda (default_path, toolkit_version, cudart_version, installs).
        - venv (path, exists, python, site_dirs, packages with normalised names).
        - nccl (path, source of VLLM_NCCL_SO_PATH, wheel or system, shadowed copies, version, code, error).
        - nccl_env (path, exists, values, invalid_lines, checks per interface variable).
        - interfaces, name to operstate, up and ipv4.
      type: dict
      sample:
        nccl: {path: /opt/vllm/current/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2,
               source: wheel, version: 2.28.9, code: 22809, shadowed: [], error: null}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_stack import DEFAULT_DEB_PATTERNS, gather


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "venv_path": {"type": "path", "default": "/opt/vllm/current"},
            "nccl_env_file": {"type": "path", "default": "/etc/kimi/nccl.env"},
            "deb_packages": {"type": "list", "elements": "str", "default": list(DEFAULT_DEB_PATTERNS)},
            "vllm_nccl_so_path": {"type": "path"},
            "probe_nccl": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )

    def run(argv: list[str]) -> tuple[int, str, str]:
        # A missing tool (no nvidia-smi on a CPU node, no apt-mark in a minimal image) is a fact, not a failure.
        executable = argv[0] if "/" in argv[0] else module.get_bin_path(argv[0])
        if not executable:
            return 127, "", f"{argv[0]}: command not found"
        return module.run_command([executable, *argv[1:]], environ_update={"LC_ALL": "C"})

    params = module.params
    try:
        facts = gather(
            run,
            venv_path=params["venv_path"],
            nccl_env_file=params["nccl_env_file"],
            deb_patterns=params["deb_packages"],
            vllm_nccl_so_path=params["vllm_nccl_so_path"],
            nvidia_smi=module.get_bin_path("nvidia-smi"),
            fabric_manager_binary=module.get_bin_path("nv-fabricmanager"),
            probe_nccl=params["probe_nccl"],
        )
    except (OSError, ValueError) as error:
        module.fail_json(msg=f"could not read the stack facts: {error}")
    module.exit_json(changed=False, ansible_facts={"kimi_stack": facts})


if __name__ == "__main__":
    main()
