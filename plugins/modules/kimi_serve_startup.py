#!/usr/bin/python
"""Ansible module: read vLLM's start-up log and put its KV cache figures next to the planner's."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_serve_startup
short_description: Compare the KV cache vLLM logged at start-up with the planner's prediction
description:
  - Parses "GPU/CPU KV cache size - N tokens", "Maximum concurrency ..." and "Available KV cache memory" from
    I(text) (rank 0's journal since the unit started) and returns them next to I(predicted_kv_tokens) and
    I(predicted_kv_gib).
  - When vLLM profiled its own budget (I(budget_from_plan) false) and tokens or budget differ from the plan by
    more than I(warn_share), the module returns a warning.
  - Fails only when I(require_match) is true and the numbers differ, or nothing was logged.
  - Pure judgement; changes nothing.
options:
  text:
    description: vLLM's start-up log.
    type: str
    default: ''
  predicted_kv_tokens:
    description: The planner's KV tokens (kv_tokens_deployed when the planned budget was passed to vLLM).
    type: int
  predicted_kv_gib:
    description: The planner's per-GPU KV budget in GiB (the limiting stage's).
    type: float
  budget_from_plan:
    description: The planned budget was passed to vLLM (--kv-cache-memory-bytes), so tokens are equal by construction.
    type: bool
    default: false
  warn_share:
    description: Relative gap between logged and planned tokens or budget above which a warning is returned.
    type: float
    default: 0.02
  require_match:
    description: Fail when the logged KV tokens differ from the prediction.
    type: bool
    default: false
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.reads_only
"""

EXAMPLES = r"""
- name: Compare vLLM's KV tokens with the plan
  kimi_serve_startup:
    text: "{{ journal.stdout }}"
    predicted_kv_tokens: "{{ plan.kv_tokens }}"
"""

RETURN = r"""
logged:
  description: The parsed start-up numbers.
  returned: always
  type: dict
kv:
  description: >-
    Logged and predicted KV tokens and budget, their differences (absolute and relative), warnings and a
    one-line summary.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_serve import compare_kv, parse_startup_log


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "text": {"type": "str", "default": ""},
            "predicted_kv_tokens": {"type": "int"},
            "predicted_kv_gib": {"type": "float"},
            "budget_from_plan": {"type": "bool", "default": False},
            "warn_share": {"type": "float", "default": 0.02},
            "require_match": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    logged = parse_startup_log(module.params["text"])
    kv = compare_kv(
        logged,
        module.params["predicted_kv_tokens"],
        module.params["predicted_kv_gib"],
        budget_from_plan=module.params["budget_from_plan"],
        warn_share=module.params["warn_share"],
    )
    if module.params["require_match"] and not kv["match"]:
        module.fail_json(msg=kv["summary"], logged=logged, kv=kv)
    for warning in kv["warnings"]:
        module.warn(warning)
    module.exit_json(changed=False, logged=logged, kv=kv, msg=kv["summary"])


if __name__ == "__main__":
    main()
