#!/usr/bin/python
"""Ansible module: judge, from every rank's journal, that the whole vLLM group joined on the same NCCL."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_rank_join
short_description: Check from the ranks' journals that every vLLM rank joined, on one NCCL version
description:
  - Parses each node's journal of its vLLM unit's current run for the join line every worker logs
    (C(world_size=N rank=R local_rank=L distributed_init_method=M backend=B)), the role assignment line, and
    the NCCL version the worker loaded (C(vLLM is using nccl==X), or NCCL's own C(NCCL version X) banner).
  - Fails, naming hosts and ranks, when a node shows no joining rank, ranks disagree on the world size or the
    rendezvous address, a rank id is missing or joined too often, or NCCL versions differ between ranks or
    from I(expected_nccl_version). With a gloo backend (vLLM's CPU build) the NCCL check is not applicable and
    says so.
  - Pure parsing; changes nothing.
options:
  journals:
    description: Node name to that node's journal text (the unit's current invocation only).
    type: dict
    required: true
  expected_world_size:
    description: Ranks in one model replica (tensor x pipeline parallel); 0 accepts what the ranks report.
    type: int
    default: 0
  expected_processes:
    description: Rank processes in the whole deployment (world size x data-parallel replicas); 0 means one replica.
    type: int
    default: 0
  expected_nccl_version:
    description: The NCCL version every rank must load (the pinned nvidia-nccl wheel); empty skips the comparison.
    type: str
    default: ''
  fail_on_problem:
    description: Fail when a problem is found (false returns the findings for a report).
    type: bool
    default: true
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.reads_only
"""

EXAMPLES = r"""
- name: Check that every rank joined
  kimi_rank_join:
    journals: {node1: "{{ j1.stdout }}", node2: "{{ j2.stdout }}"}
    expected_world_size: 16
    expected_processes: 16
    expected_nccl_version: 2.28.9
  delegate_to: localhost
"""

RETURN = r"""
ranks:
  description:
    - One entry per joined worker (host, rank, world_size, local_rank, backend, init_method, roles, nccl_version).
  returned: always
  type: list
  elements: dict
problems:
  description: What is wrong, one line each, naming hosts and ranks.
  returned: always
  type: list
  elements: str
summary:
  description: One line, e.g. "2 rank(s) joined on 2 node(s), world size 2, NCCL not applicable ...".
  returned: always
  type: str
nccl:
  description: The NCCL version(s) the ranks loaded, or why it does not apply.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_ranks import judge_rank_join


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            # Free-form: inventory hostname to that rank's journal text.
            "journals": {"type": "dict", "required": True},
            "expected_world_size": {"type": "int", "default": 0},
            "expected_processes": {"type": "int", "default": 0},
            "expected_nccl_version": {"type": "str", "default": ""},
            "fail_on_problem": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    params = module.params
    journals = {str(host): str(text or "") for host, text in params["journals"].items()}
    result = judge_rank_join(
        journals, params["expected_world_size"], params["expected_processes"], params["expected_nccl_version"]
    )
    if params["fail_on_problem"] and result["problems"]:
        module.fail_json(msg="; ".join(result["problems"]), **result)
    module.exit_json(changed=False, msg=result["summary"], **result)


if __name__ == "__main__":
    main()
