#!/usr/bin/python
"""Ansible module: GPUs and the processes holding GPU memory, from nvidia-smi on the node."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_gpu_info
short_description: Read the node's GPUs (model, memory, driver) and the processes holding GPU memory
description:
  - Runs two read-only nvidia-smi CSV queries on the node, one for the GPUs and one for the compute processes,
    and returns them parsed (plugins/module_utils/kimi_gpu.py). Values nvidia-smi cannot fill (C([N/A]),
    C([Not Supported])) come back as null.
  - Also returns, for each GPU, the planner's GPU preset whose driver name matches and whether the memory the
    driver reports equals the preset's, so preflight can compare them.
  - Changes nothing; supports check mode.
options:
  nvidia_smi:
    description: Path or name of the nvidia-smi executable.
    type: str
    default: nvidia-smi
  missing_ok:
    description: When nvidia-smi is not installed, return C(nvidia_smi_found=false) and no GPUs instead of failing
      (for nodes whose inventory replaces the GPU checks with CPU ones).
    type: bool
    default: false
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.reads_only
"""

EXAMPLES = r"""
- name: Read the GPUs
  kimi_gpu_info:
  register: gpu_facts

- name: No other process may hold GPU memory
  ansible.builtin.assert:
    that: gpu_facts.compute_processes | length == 0
    fail_msg: "{{ inventory_hostname }}: GPU memory held by {{ gpu_facts.busy_descriptions | join('; ') }}"
"""

RETURN = r"""
nvidia_smi_found:
  description: Whether nvidia-smi was found.
  returned: always
  type: bool
gpu_count:
  description: Number of GPUs nvidia-smi lists.
  returned: always
  type: int
gpus:
  description: One entry per GPU (index, name, uuid, memory_total_mib, memory_total_gib, memory_used_mib,
    driver_version, pci_bus_id, processes, preset, preset_memory_mib, memory_matches_preset).
  returned: always
  type: list
  elements: dict
gpu_names:
  description: Distinct GPU names.
  returned: always
  type: list
  elements: str
driver_versions:
  description: Distinct driver versions (more than one means a broken node).
  returned: always
  type: list
  elements: str
memory_total_mib_min:
  description: Smallest memory.total among the GPUs, MiB.
  returned: always
  type: int
compute_processes:
  description: Processes holding GPU memory (pid, process_name, used_memory_mib, gpu_uuid, gpu_index).
  returned: always
  type: list
  elements: dict
busy_gpus:
  description: GPUs with processes on them and those processes' PIDs.
  returned: always
  type: list
  elements: dict
busy_descriptions:
  description: One line per process holding GPU memory, naming its PID.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_gpu import (
    APPS_QUERY_ARGS,
    GPU_QUERY_ARGS,
    NvidiaSmiParseError,
    describe_busy,
    gpu_facts,
)
from ansible_collections.kimi.k2.plugins.module_utils.kimi_presets import gpu_preset_for_driver_name

EMPTY = dict(
    gpu_count=0,
    gpus=[],
    gpu_names=[],
    driver_versions=[],
    memory_total_mib_min=None,
    memory_total_mib_sum=0,
    compute_processes=[],
    busy_gpus=[],
    busy_descriptions=[],
)


def run_query(module: AnsibleModule, executable: str, args: tuple[str, ...]) -> str:
    rc, out, err = module.run_command([executable, *args], check_rc=False)
    if rc != 0:
        module.fail_json(
            msg=f"{executable} {' '.join(args)} failed with exit status {rc}: {(err or out).strip()}",
            rc=rc,
            stdout=out,
            stderr=err,
        )
    return out


def add_presets(facts: dict) -> None:
    """Name the planner's preset for each GPU and whether the driver reports the preset's memory."""
    for gpu in facts["gpus"]:
        preset = gpu_preset_for_driver_name(gpu["name"] or "")
        gpu["preset"] = preset.key if preset else None
        gpu["preset_memory_mib"] = preset.memory_mib if preset else None
        gpu["memory_matches_preset"] = (
            None if preset is None or gpu["memory_total_mib"] is None else gpu["memory_total_mib"] == preset.memory_mib
        )


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            nvidia_smi=dict(type="str", default="nvidia-smi"),
            missing_ok=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    executable = module.get_bin_path(module.params["nvidia_smi"])
    if executable is None:
        if module.params["missing_ok"]:
            module.exit_json(changed=False, nvidia_smi_found=False, **EMPTY)
        module.fail_json(msg=f"nvidia-smi not found ({module.params['nvidia_smi']}): is the NVIDIA driver installed?")
    gpu_text = run_query(module, executable, GPU_QUERY_ARGS)
    apps_text = run_query(module, executable, APPS_QUERY_ARGS)
    try:
        facts = gpu_facts(gpu_text, apps_text)
    except NvidiaSmiParseError as exc:
        problem = str(exc)
    else:
        problem = None
    if problem:
        module.fail_json(msg=f"cannot parse nvidia-smi output: {problem}", stdout=gpu_text + apps_text)
    add_presets(facts)
    facts["busy_descriptions"] = describe_busy(facts)
    module.exit_json(changed=False, nvidia_smi_found=True, **facts)


if __name__ == "__main__":
    main()
