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
  - I(kind=group) takes every node's unit state in I(group) and returns C(restart) with the C(reasons): files
    changed, a unit not active, a headless rank started after rank 0 (restarted alone, it cannot rejoin), a
    rank 0 that is not listening (I(probe_refused)) and started more than I(start_window) seconds after a
    headless rank (restarted alone, it waits for ranks that joined the previous one), or the one-token probe
    of rank 0 failed (I(probe_ok) false).
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
        (C(systemctl show -p ExecMainStartTimestamp --timestamp=unix), e.g. C(@1795997366)).
    type: list
    elements: dict
  probe_ok:
    description: Kind group, whether the one-token request to rank 0 succeeded; omitted when not probed.
    type: bool
  probe_refused:
    description: Kind group, whether rank 0 refused the probe's connection (not listening yet).
    type: bool
    default: false
  start_window:
    description:
      - Kind group, seconds a group start may spread between the headless ranks and rank 0. A rank 0 that
        refuses connections and started later than this after a headless rank was restarted alone.
    type: int
    default: 300
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
from ansible.module_utils.kimi_serve import (
    compare_kv,
    group_restart_reasons,
    parse_ray_status,
    parse_startup_log,
    ray_status_problems,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "kind": {"type": "str", "required": True, "choices": ["vllm_log", "ray_status", "group"]},
            "text": {"type": "str", "default": ""},
            "group": {"type": "list", "elements": "dict"},
            "probe_ok": {"type": "bool"},
            "probe_refused": {"type": "bool", "default": False},
            "start_window": {"type": "int", "default": 300},
            "predicted_kv_tokens": {"type": "int"},
            "require_match": {"type": "bool", "default": False},
            "nodes": {"type": "int"},
            "gpus_per_node": {"type": "int"},
        },
        supports_check_mode=True,
    )
    params = module.params
    if params["kind"] == "group":
        reasons = group_restart_reasons(
            params["group"] or [], params["probe_ok"], params["probe_refused"], params["start_window"]
        )
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
