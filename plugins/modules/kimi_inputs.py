#!/usr/bin/python
"""Ansible module: judge the inputs of every phase a run goes through, on the controller, before any node changes."""

from __future__ import annotations

DOCUMENTATION = r"""
module: kimi_inputs
short_description: Refuse, before anything is installed, the inputs a later phase of the run could not use
description:
  - Judges, for every host, the values the phases in I(phases) read (the kimi role's cluster values plus the
    phase roles' variables an inventory or -e sets), that is a checkpoint revision that is a 40-hex commit, a
    repository id of the form org/name that is the model's, exact and consistent pins, no pin a known advisory
    affects (the snapshot in C(kimi_advisories_file), less C(kimi_accepted_advisories)), every C(kimi_*_port) in
    range and none shared (and no retired per-role port variable), admin networks that are addresses or CIDR
    networks, a public API only with a key and without a router, the router's limits in range, absolute paths, a
    known model and GPU, a serve layout vLLM has, and the planner's verdict on the layout.
  - A value several roles read is judged by the kimi role's one name, the one the inventory sets (e.g.
    C(kimi_checkpoint_revision is not set)); a retired per-role copy an inventory still sets is refused naming
    its successor (RETIRED_VARIABLES in plugins/module_utils/kimi_inputs.py).
  - Each problem names the hosts, the variable, the phase that needs it and how to set it; the same problem on
    several hosts is one entry. The kimi role calls it once per host (so that any strategy works, C(free)
    included) and hands the plan to the first host's call only.
  - Types and choices are the roles' argument specs' job; the kimi role validates what the inventory sets for
    each phase role against that role's spec before calling this module.
  - Written by hand because no Ansible or Hub library judges these project-specific relations; version syntax
    comes from C(packaging), presets from the planner (plugins/module_utils/kimi_presets.py).
  - Changes nothing; supports check mode.
options:
  hosts:
    description: Host name -> the values its phases read (variable name -> value).
    type: dict
    required: true
  phases:
    description: >-
      The phases that will run, already narrowed by --tags/--skip-tags (PHASES in
      plugins/module_utils/kimi_inputs.py), or C(offline_mirror) for the mirror host's own check.
    type: list
    elements: str
    required: true
  plan:
    description: The registered result of the kimi role's kimi_plan task (failed or not); its problems count too.
    type: dict
  common:
    description:
      - Judge the kimi role's cluster values too (model, GPU, paths, the API and master ports, the interface).
      - False for a role that judges only its own inputs on a host that may serve nothing (roles/offline_mirror).
    type: bool
    default: true
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.reads_only
"""

EXAMPLES = r"""
- name: Check this host's inputs for the phases this run goes through
  kimi_inputs:
    hosts: >-
      {{ {inventory_hostname: {'kimi_checkpoint_revision': kimi_checkpoint_revision, 'kimi_model': kimi_model}} }}
    phases: [checkpoint]
  delegate_to: localhost
"""

RETURN = r"""
problems:
  description: One entry per problem; C(text) is the line the failure message prints.
  returned: always
  type: list
  elements: dict
  sample:
    - hosts: [gn-h100-node1, gn-h100-node2]
      variable: kimi_checkpoint_revision
      phase: checkpoint
      message: is not set
      fix: pin the 40-hex commit of moonshotai/Kimi-K2.7-Code ...
      text: "gn-h100-node1, gn-h100-node2: kimi_checkpoint_revision is not set (needed by the checkpoint phase); ..."
phases:
  description: The phases whose inputs were judged.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_inputs import ARGUMENT_SPEC, inputs_answer


# plugins/action/kimi_inputs.py runs the same answer in the controller's process (the task runs on the
# controller anyway); this module is what runs where no action plugin is found, and what ansible-doc reads.
def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    fields, failure = inputs_answer(module.params)
    if failure:
        module.fail_json(msg=failure, changed=False, **fields)
    module.exit_json(changed=False, **fields)


if __name__ == "__main__":
    main()
