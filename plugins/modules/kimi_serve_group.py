#!/usr/bin/python
"""Ansible module: decide whether the vLLM group must be restarted as one, and say why."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_serve_group
short_description: Decide from every node's unit state whether the whole vLLM group must restart
description:
  - Takes every node's unit state in I(group) and returns C(restart) with the C(reasons) - files changed, a
    unit not active, a headless rank started after rank 0 (restarted alone, it cannot rejoin), a headless
    rank whose connection to rank 0's master port rank 0 closed (rank 0 restarted alone waits for ranks that
    joined the previous one), or the one-token probe of rank 0 failed (I(probe_ok) false).
  - Pure judgement; changes nothing. The vllm_serve role restarts the group in order when C(restart) is true.
options:
  group:
    description:
      - One entry per node; keys host, unit, serves_api, changed, active_state, started_at
        (C(systemctl show -p ExecMainStartTimestamp --timestamp=unix), e.g. C(@1795997366)), and for a
        headless rank rendezvous (C(ADDRESS:PORT) of rank 0's master port) and ss (C(ss -Htan) on its node).
    type: list
    elements: dict
    required: true
  probe_ok:
    description: Whether the one-token request to rank 0 succeeded; omitted when not probed.
    type: bool
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.reads_only
"""

EXAMPLES = r"""
- name: Decide whether the group restarts
  kimi_serve_group:
    group: "{{ ansible_play_hosts | map('extract', hostvars, 'unit_state') | list }}"
    probe_ok: "{{ probe.status | default(0) == 200 }}"
  run_once: true
  register: group_decision
"""

RETURN = r"""
restart:
  description: Whether the whole group must be restarted.
  returned: always
  type: bool
reasons:
  description: Why, one line per finding naming the host and unit.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_serve import group_restart_reasons, rendezvous_states


def with_rendezvous_states(node: dict) -> dict:
    """The node's entry plus the states of its connections to rank 0's master port (headless ranks only)."""
    if not node.get("rendezvous"):
        return node
    return {**node, "rendezvous_states": rendezvous_states(node.get("ss") or "", node["rendezvous"])}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "group": {"type": "list", "elements": "dict", "required": True},
            "probe_ok": {"type": "bool"},
        },
        supports_check_mode=True,
    )
    group = [with_rendezvous_states(node) for node in module.params["group"]]
    reasons = group_restart_reasons(group, module.params["probe_ok"])
    module.exit_json(changed=False, restart=bool(reasons), reasons=reasons, msg="; ".join(reasons) or "no restart")


if __name__ == "__main__":
    main()
