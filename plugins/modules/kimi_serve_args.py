#!/usr/bin/python
"""Ansible module: every node's `vllm serve` command line and unit for the chosen serving layout."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_serve_args
short_description: Build each node's vllm serve argv and unit name for a serving layout
description:
  - Runs on the controller once, for all nodes together, so every rank's command comes from the same inputs.
  - Layouts C(mp) (native multi-node, C(--nnodes)/C(--node-rank), C(--headless) on ranks above 0), C(ray)
    (one C(vllm serve --distributed-executor-backend ray) on the head), C(dp_ep) (data parallel with start
    ranks from the node order and GPUs per node, C(--headless) on nodes above 0), C(single) (one node).
  - Fails naming the inventory variable to change when the layout does not fit the nodes, or the load format or
    the weight cache (C(vllm preload) per node, C(--load-format ipc_cache) on every rank) cannot be served.
  - Changes nothing; check mode returns the same answer.
options:
  spec:
    description: The fields of plugins/module_utils/kimi_serve.py's ServeSpec (layout, model_path, hosts_by_rank,
      host_ips, gpus_per_node, tensor_parallel_size, ...), as the vllm_serve role passes them.
    type: dict
    required: true
  binary:
    description: The vllm executable, for the rendered C(exec_start).
    type: str
    default: /opt/vllm/current/bin/vllm
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.reads_only
"""

EXAMPLES = r"""
- name: Work out every node's vllm serve command
  kimi_serve_args:
    spec:
      layout: mp
      model_path: /data/models/kimi-k2.7-code
      hosts_by_rank: [node1, node2]
      host_ips: {node1: 10.0.0.11, node2: 10.0.0.12}
      gpus_per_node: 8
      tensor_parallel_size: 8
      pipeline_parallel_size: 2
  run_once: true
  delegate_to: localhost
"""

RETURN = r"""
nodes:
  description: Per host, its rank, unit (null for a Ray worker), whether it serves the API, the argv after the
    vllm binary and the ExecStart= text; with C(weight_cache) also the weight-cache daemon's argv
    (C(preload_argv)) and its ExecStart= text (C(preload_exec_start)), empty otherwise.
  returned: success
  type: dict
  sample: {"node1": {"rank": 0, "unit": "kimi-vllm.service", "serves_api": true, "argv": ["serve", "/data"]}}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_serve import (
    ServeInputError,
    ServeSpec,
    exec_start,
    plan_nodes,
    validate,
)

INT_FIELDS = (
    "gpus_per_node",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "decode_context_parallel_size",
    "master_port",
    "data_parallel_rpc_port",
    "api_port",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "kv_cache_memory_bytes",
    "block_size",
    "shutdown_timeout",
    "weight_cache_port",
    "weight_cache_wait_s",
)
BOOL_FIELDS = (
    "enable_expert_parallel",
    "trust_remote_code",
    "enable_auto_tool_choice",
    "language_model_only",
    "enforce_eager",
    "weight_cache",
    "prefix_caching",
)


def _as_bool(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def spec_from_params(raw: dict) -> ServeSpec:
    """Coerce the templated values (Jinja may hand numbers over as strings), naming a field that is not a
    number."""
    values = dict(raw)
    for name in INT_FIELDS:
        if name in values:
            try:
                values[name] = int(values[name])
            except (TypeError, ValueError) as error:
                raise ServeInputError(name, f"{values[name]!r} is not an integer") from error
    for name in BOOL_FIELDS:
        if name in values:
            values[name] = _as_bool(values[name])
    if "gpu_memory_utilization" in values:
        values["gpu_memory_utilization"] = float(values["gpu_memory_utilization"] or 0)
    values["extra_args"] = tuple(str(word) for word in values.get("extra_args") or ())
    values["hosts_by_rank"] = tuple(values.get("hosts_by_rank") or ())
    try:
        return ServeSpec(**values)
    except TypeError as error:
        raise ServeInputError("spec", str(error)) from error


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            # ServeSpec's fields, left untyped here on purpose: spec_from_params converts them and names the field and
            # the inventory variable in a refusal (ServeInputError), where Ansible's own type error would not;
            # ServeSpec itself refuses an unknown key. One definition of the fields, in kimi_serve.
            "spec": {"type": "dict", "required": True},
            "binary": {"type": "str", "default": "/opt/vllm/current/bin/vllm"},
        },
        supports_check_mode=True,
    )
    binary = module.params["binary"]
    try:
        spec = spec_from_params(module.params["spec"])
        problems = validate(spec)
        if problems:
            module.fail_json(msg="; ".join(str(problem) for problem in problems))
        nodes = plan_nodes(spec)
    except ServeInputError as error:
        module.fail_json(msg=str(error))
    for node in nodes.values():
        node["exec_start"] = exec_start(binary, node["argv"]) if node["unit"] else ""
        node["preload_exec_start"] = exec_start(binary, node["preload_argv"]) if node["preload_argv"] else ""
    module.exit_json(changed=False, nodes=nodes)


if __name__ == "__main__":
    main()
