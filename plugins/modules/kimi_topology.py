#!/usr/bin/python
"""Ansible module: resolve node ranks and check the parallel layout against the inventory."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_topology
short_description: Resolve node ranks from inventory order and check the parallel layout fits the nodes
description:
  - Runs on the controller once. Takes the hosts of the C(kimi_nodes) group in inventory order and any
    C(kimi_node_rank) overrides, and returns the rank of every host (rank 0 serves the API and is the master).
  - Fails, naming the variable and the host, when ranks are duplicated, out of range or not integers, or when
    tensor x pipeline x data parallel sizes do not equal nodes x GPUs per node.
  - Changes nothing; check mode returns the same answer.
options:
  hosts:
    description: Hosts of the serving group, in inventory order.
    type: list
    elements: str
    required: true
  rank_overrides:
    description: Host name to C(kimi_node_rank) value, for the hosts that set one.
    type: dict
    default: {}
  gpus_per_node:
    description: C(kimi_gpus_per_node).
    type: raw
    required: true
  tensor_parallel_size:
    description: C(kimi_tensor_parallel_size).
    type: raw
    required: true
  pipeline_parallel_size:
    description: C(kimi_pipeline_parallel_size).
    type: raw
    default: 1
  data_parallel_size:
    description: C(kimi_data_parallel_size).
    type: raw
    default: 1
  decode_context_parallel_size:
    description: C(kimi_decode_context_parallel_size); must divide the tensor parallel size.
    type: raw
    default: 1
  enable_expert_parallel:
    description: C(kimi_enable_expert_parallel).
    type: bool
    default: false
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.reads_only
"""

EXAMPLES = r"""
- name: Resolve node ranks and check the layout
  kimi_topology:
    hosts: "{{ groups['kimi_nodes'] }}"
    rank_overrides: "{{ kimi_rank_overrides }}"
    gpus_per_node: "{{ kimi_gpus_per_node }}"
    tensor_parallel_size: "{{ kimi_tensor_parallel_size }}"
    pipeline_parallel_size: "{{ kimi_pipeline_parallel_size }}"
  run_once: true
  delegate_to: localhost
"""

RETURN = r"""
node_ranks:
  description: Rank of every host.
  returned: success
  type: dict
  sample: {"gn-node1": 0, "gn-node2": 1}
hosts_by_rank:
  description: Hosts ordered by rank.
  returned: success
  type: list
  sample: ["gn-node1", "gn-node2"]
master_host:
  description: The rank-0 host (serves the API, master address of the group).
  returned: success
  type: str
  sample: gn-node1
world_size:
  description: GPUs the layout occupies (tp x pp x dp).
  returned: success
  type: int
  sample: 16
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_topology import ARGUMENT_SPEC, topology_answer


# plugins/action/kimi_topology.py runs the same answer in the controller's process (the task runs on the
# controller anyway); this module is what runs where no action plugin is found, and what ansible-doc reads.
def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    fields, failure = topology_answer(module.params)
    if failure:
        module.fail_json(msg=failure, **fields)
    module.exit_json(changed=False, **fields)


if __name__ == "__main__":
    main()
