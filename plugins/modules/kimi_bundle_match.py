#!/usr/bin/python
"""Ansible module: refuse a served air-gapped bundle built for other inputs than a node's, before it installs."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_bundle_match
short_description: Refuse a kimi.k2 bundle that was built for other inputs than a node's
description:
  - Reads I(manifest), the text of a bundle's C(kimi-bundle.json) as the offline mirror serves it, and compares
    what the bundle was built for (its C(built_for), that is the inventory's name, the distribution, codename and
    architecture, Python and pip platforms, the apt and pip pins, the unpinned debs, the hf CLI's version, the
    checkpoint) with I(variables), one node's resolved values of the variables C(bin/kimi-bundle build) reads.
  - >-
    Fails naming I(host) and every difference, each with the variable to change and both values, e.g.
    "pip package vllm (kimi_vllm_pip_pins): the bundle has 0.23.0, the inventory pins 0.23.1".
  - Fails too on a manifest it cannot use (not JSON, another schema, a C(built_for) whose recorded sha256 does
    not match its inputs, i.e. edited after the build) and on node values no bundle is built for, naming the
    variable. It does not check the manifest's signature; the offline mirror served only a bundle whose
    signature by the pinned key it checked (C(kimi_bundle_verify)).
  - >-
    Runs on the controller (C(delegate_to: localhost)); the logic is plugins/module_utils/kimi_bundle_fetch.py
    (C(match_manifest)), which needs C(packaging), a dependency of ansible-core.
  - Reads only; never reports a change.
options:
  manifest:
    description: The manifest's text (C(kimi-bundle.json)), e.g. the C(content) of an C(ansible.builtin.uri) GET.
    type: str
    required: true
  variables:
    description:
      - The node's resolved values of the build's input variables (C(kimi_bundle_inputs.INPUT_VARIABLES)), as
        C(playbooks/vars/bundle_inputs.yml) resolves them into C(kimi_bundle_node_inputs).
    type: dict
    required: true
  host:
    description: The node these values are for, named in every message.
    type: str
    required: true
  source:
    description: Where the manifest came from (its URL), named in every message.
    type: str
    default: kimi-bundle.json
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.reads_only
"""

EXAMPLES = r"""
- name: Fetch the manifest the offline mirror serves
  ansible.builtin.uri:
    url: "{{ kimi_offline_mirror_url }}kimi-bundle.json"
    return_content: true
  register: served
  delegate_to: localhost
  run_once: true

- name: Refuse a bundle built for other inputs than this node's
  kimi.k2.kimi_bundle_match:
    manifest: "{{ served.content }}"
    variables: "{{ kimi_bundle_node_inputs }}"
    host: "{{ inventory_hostname }}"
    source: "{{ kimi_offline_mirror_url }}kimi-bundle.json"
  delegate_to: localhost
"""

RETURN = r"""
differences:
  description: One line per input the bundle was built for otherwise (empty on success).
  returned: always
  type: list
  elements: str
  sample:
    - "apt package libnccl2 (kimi_deb_pins): the bundle has 2.30.7-1+cuda13.3, the inventory pins 2.30.8-1+cuda13.3"
inputs_sha256:
  description: The sha256 of the inputs the bundle was built for, as its manifest records them.
  returned: when the manifest could be read
  type: str
"""

from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_fetch import (
    bad_manifest_message,
    bad_node_inputs_message,
    match_manifest,
    mismatch_message,
)
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_inputs import BundleInputError
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_tree import ManifestError


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "manifest": {"type": "str", "required": True},
            # Free-form: variable name to the node's value; kimi_bundle_inputs judges each, naming the variable.
            "variables": {"type": "dict", "required": True},
            "host": {"type": "str", "required": True},
            "source": {"type": "str", "default": "kimi-bundle.json"},
        },
        supports_check_mode=True,
    )
    params = module.params
    host, source = params["host"], params["source"]
    result: dict[str, Any] = {"changed": False, "differences": []}
    try:
        match = match_manifest(params["manifest"], params["variables"])
    except ManifestError as error:
        module.fail_json(msg=bad_manifest_message(host, source, error), **result)
    except BundleInputError as error:
        module.fail_json(msg=bad_node_inputs_message(host, error), **result)
    result.update(differences=match.differences, inputs_sha256=match.inputs_sha256)
    if match.differences:
        module.fail_json(msg=mismatch_message(host, source, match.differences), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
