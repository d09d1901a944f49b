#!/usr/bin/python
"""Ansible module: where one start of a vLLM unit spent its time, read from its journal on the node."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_start_phases
short_description: Time the phases of one start of a vLLM unit from its journal
description:
  - Reads the journal of one start (one systemd invocation) of I(unit) with
    C(journalctl -u UNIT _SYSTEMD_INVOCATION_ID=ID -o json) and returns the milestones vLLM logged (the group
    formed, the weights loaded, compile, CUDA graph capture, the engine ready, the API up) and the phases between
    them (docs/self-healing.md, "Where a start spends its time").
  - A milestone the log does not show is null, never guessed; where several workers log a marker, the last one
    marks it.
  - The start itself is the unit's C(ExecMainStartTimestamp) when the invocation read is the unit's current one
    (C(systemctl show --timestamp=unix), whole seconds); the first token is the caller's I(first_token_at).
  - Read-only; identical in check mode.
options:
  unit:
    description: The vLLM unit, e.g. C(kimi-vllm.service) or C(kimi-vllm-headless.service).
    type: str
    required: true
  invocation_id:
    description: The start to read (systemd's InvocationID); default the unit's current one (C(systemctl show)).
    type: str
  first_token_at:
    description: When the first token of this start was generated, in seconds since the epoch (the log cannot say).
    type: float
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.reads_only
"""

EXAMPLES = r"""
- name: Time the current start of rank 0
  kimi.k2.kimi_start_phases:
    unit: kimi-vllm.service
  register: start

- name: Time an earlier start, with the first token the verify phase measured
  kimi.k2.kimi_start_phases:
    unit: kimi-vllm-headless.service
    invocation_id: 97f14d1ee3814b38a505526f2512072a
    first_token_at: 1796473092.5
"""

RETURN = r"""
invocation_id:
  description: The invocation whose journal was read.
  returned: success
  type: str
milestones:
  description: >-
    Seconds since the epoch at which the start reached C(started), C(rendezvous_entered), C(group_formed),
    C(weights_loaded), C(compile_started), C(compiled), C(graphs_captured), C(engine_ready), C(api_starting),
    C(api_up) and C(first_token), in that order; null where the journal does not show one (a headless rank has no
    C(engine_ready) or API, the CPU build no C(graphs_captured)).
  returned: success
  type: dict
phases:
  description: >-
    The time between each milestone found and the next one found, as C(start), C(end) (milestone names) and
    C(seconds); a phase whose end is missing is left out and the next one starts at the last milestone found.
  returned: success
  type: list
  elements: dict
reported:
  description: >-
    What vLLM itself said a step took, the slowest worker's figure or null: C(loading_weights_s),
    C(stream_s) (Run:ai's streamer, with C(--load-format runai_streamer)), C(model_loading_s),
    C(model_loading_gib), C(compile_s), C(graph_capture_s), C(graph_capture_gib), C(init_engine_s).
  returned: success
  type: dict
workers:
  description: The worker processes on this node that entered the rendezvous (0 when none did).
  returned: success
  type: int
entries:
  description: The journal entries read for this invocation.
  returned: success
  type: int
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_start_phases import parse_journal_json, start_phases
from ansible_collections.kimi.k2.plugins.module_utils.kimi_systemd import parse_unit, unix_timestamp


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "unit": {"type": "str", "required": True},
            "invocation_id": {"type": "str"},
            "first_token_at": {"type": "float"},
        },
        supports_check_mode=True,
    )
    unit = module.params["unit"]
    systemctl = module.get_bin_path("systemctl", required=True)
    journalctl = module.get_bin_path("journalctl", required=True)
    show = [systemctl, "show", "-p", "InvocationID", "-p", "ExecMainStartTimestamp", "--timestamp=unix", unit]
    rc, out, err = module.run_command(show, environ_update={"LC_ALL": "C"})
    if rc != 0:
        module.fail_json(msg=f"systemctl show {unit} failed: {err.strip() or out.strip()}", rc=rc)
    properties = parse_unit(out)
    current = properties.get("InvocationID", "").strip()
    invocation = module.params["invocation_id"] or current
    if not invocation:
        module.fail_json(msg=f"{unit} has no invocation: it has not started since the last boot")
    # The unit's start time belongs to its current invocation only.
    started_at = unix_timestamp(properties.get("ExecMainStartTimestamp")) if invocation == current else None
    read = [journalctl, "-u", unit, f"_SYSTEMD_INVOCATION_ID={invocation}", "-o", "json", "--no-pager", "--quiet"]
    rc, out, err = module.run_command(read, environ_update={"LC_ALL": "C"})
    if rc != 0:
        module.fail_json(msg=f"journalctl -u {unit} failed: {err.strip() or out.strip()}", rc=rc)
    try:
        entries = parse_journal_json(out)
    except ValueError as error:
        module.fail_json(msg=f"could not read the journal of {unit}: {error}")
    phases = start_phases(
        entries, invocation_id=invocation, started_at=started_at, first_token_at=module.params["first_token_at"]
    )
    module.exit_json(changed=False, entries=len(entries), **phases.as_dict())


if __name__ == "__main__":
    main()
