#!/usr/bin/python
"""Ansible module: judge `ray status` against the nodes and GPUs the cluster must have."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_ray_status
short_description: Check that ray status shows every node and every GPU, and no recent failure
description:
  - Counts the active nodes and the GPU total in I(text) (the output of C(ray status)) and fails unless they
    are I(nodes) and I(nodes) x I(gpus_per_node), or when Ray lists recent failures.
  - Pure judgement; changes nothing.
options:
  text:
    description: The output of C(ray status).
    type: str
    required: true
  nodes:
    description: Nodes the Ray cluster must show.
    type: int
    required: true
  gpus_per_node:
    description: GPUs each node registers with Ray.
    type: int
    default: 0
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.reads_only
"""

EXAMPLES = r"""
- name: Check the Ray cluster has every node and GPU
  kimi_ray_status:
    text: "{{ ray_status.stdout }}"
    nodes: "{{ ansible_play_hosts | length }}"
    gpus_per_node: 8
"""

RETURN = r"""
ray:
  description: Active nodes, resource totals and failures.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_serve import parse_ray_status, ray_status_problems


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "text": {"type": "str", "required": True},
            "nodes": {"type": "int", "required": True},
            "gpus_per_node": {"type": "int", "default": 0},
        },
        supports_check_mode=True,
    )
    status = parse_ray_status(module.params["text"])
    problems = ray_status_problems(status, module.params["nodes"], module.params["gpus_per_node"])
    if problems:
        module.fail_json(msg="; ".join(problems), ray=status)
    module.exit_json(changed=False, ray=status, msg=f"{status['active_nodes']} nodes, {status['resources']}")


if __name__ == "__main__":
    main()
