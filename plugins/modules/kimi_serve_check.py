#!/usr/bin/python
"""Ansible module: read vLLM's start-up log (KV tokens next to the planner's) or `ray status` (nodes, GPUs)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_serve_check
short_description: Judge what vLLM logged at start-up, or what ray status shows
description:
  - I(kind=vllm_log) parses "GPU/CPU KV cache size - N tokens", "Maximum concurrency ..." and "Available KV cache
    memory" from I(text) and returns them next to I(predicted_kv_tokens). Fails only when I(require_match) is
    true and the numbers differ (or nothing was logged).
  - I(kind=ray_status) counts active nodes and the GPU total in I(text) and fails unless they are I(nodes) and
    I(nodes) x I(gpus_per_node), or when Ray lists recent failures.
  - I(kind=group) takes every node's unit state in I(group) and returns C(restart) with the C(reasons) - files
    changed, a unit not active, a headless rank started after rank 0 (restarted alone, it cannot rejoin), a
    headless rank whose connection to rank 0's master port rank 0 closed (rank 0 restarted alone waits
    for ranks that joined the previous one), or the one-token probe of rank 0 failed (I(probe_ok) false).
  - Pure judgement; changes nothing.
options:
  kind:
    description: What I(text) is.
    type: str
    required: true
    choices: [vllm_log, ray_status, group]
  text:
    description: The log or the ray status output (kinds vllm_log and ray_status).
    type: str
    default: ''
  group:
    description:
      - Kind group, one entry per node; keys host, unit, serves_api, changed, active_state, started_at
        (C(systemctl show -p ExecMainStartTimestamp --timestamp=unix), e.g. C(@1795997366)), and for a
        headless rank rendezvous (C(ADDRESS:PORT) of rank 0's master port) and ss (C(ss -Htan) on its node).
    type: list
    elements: dict
  probe_ok:
    description: Kind group, whether the one-token request to rank 0 succeeded; omitted when not probed.
    type: bool
  predicted_kv_tokens:
    description: The planner's kv_tokens (kind vllm_log).
    type: int
  require_match:
    description: Fail when the logged KV tokens differ from the prediction (kind vllm_log).
    type: bool
    default: false
  nodes:
    description: Nodes the Ray cluster must show (kind ray_status).
    type: int
  gpus_per_node:
    description: GPUs each node registers with Ray (kind ray_status).
    type: int
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.reads_only
"""

EXAMPLES = r"""
- name: Compare vLLM's KV tokens with the plan
  kimi_serve_check:
    kind: vllm_log
    text: "{{ journal.stdout }}"
    predicted_kv_tokens: "{{ plan.kv_tokens }}"
"""

RETURN = r"""
logged:
  description: The parsed start-up numbers (kind vllm_log).
  returned: kind is vllm_log
  type: dict
kv:
  description: Logged and predicted KV tokens, their difference and a one-line summary.
  returned: kind is vllm_log
  type: dict
ray:
  description: Active nodes, resource totals and failures (kind ray_status).
  returned: kind is ray_status
  type: dict
restart:
  description: Whether the whole group must be restarted (kind group).
  returned: kind is group
  type: bool
reasons:
  description: Why, one line per finding naming the host and unit (kind group).
  returned: kind is group
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

try:  # installed as the kimi.k2 collection
    from ansible_collections.kimi.k2.plugins.module_utils.kimi_serve import (
        compare_kv,
        group_restart_reasons,
        parse_ray_status,
        parse_startup_log,
        ray_status_problems,
        rendezvous_states,
    )
except ImportError:  # run from the repository (ansible.cfg: module_utils = plugins/module_utils)
    from ansible.module_utils.kimi_serve import (
        compare_kv,
        group_restart_reasons,
        parse_ray_status,
        parse_startup_log,
        ray_status_problems,
        rendezvous_states,
    )


def _with_rendezvous_states(node: dict) -> dict:
    if not node.get("rendezvous"):
        return node
    return {**node, "rendezvous_states": rendezvous_states(node.get("ss") or "", node["rendezvous"])}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "kind": {"type": "str", "required": True, "choices": ["vllm_log", "ray_status", "group"]},
            "text": {"type": "str", "default": ""},
            "group": {"type": "list", "elements": "dict"},
            "probe_ok": {"type": "bool"},
            "predicted_kv_tokens": {"type": "int"},
            "require_match": {"type": "bool", "default": False},
            "nodes": {"type": "int"},
            "gpus_per_node": {"type": "int"},
        },
        supports_check_mode=True,
    )
    params = module.params
    if params["kind"] == "group":
        group = [_with_rendezvous_states(node) for node in params["group"] or []]
        reasons = group_restart_reasons(group, params["probe_ok"])
        module.exit_json(changed=False, restart=bool(reasons), reasons=reasons, msg="; ".join(reasons) or "no restart")
    if params["kind"] == "ray_status":
        status = parse_ray_status(params["text"])
        problems = ray_status_problems(status, params["nodes"] or 0, params["gpus_per_node"] or 0)
        if problems:
            module.fail_json(msg="; ".join(problems), ray=status)
        module.exit_json(changed=False, ray=status, msg=f"{status['active_nodes']} nodes, {status['resources']}")
    logged = parse_startup_log(params["text"])
    kv = compare_kv(logged, params["predicted_kv_tokens"])
    if params["require_match"] and not kv["match"]:
        module.fail_json(msg=kv["summary"], logged=logged, kv=kv)
    module.exit_json(changed=False, logged=logged, kv=kv, msg=kv["summary"])


if __name__ == "__main__":
    main()
