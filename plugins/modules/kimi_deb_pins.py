#!/usr/bin/python
"""Ansible module: pin a set of Debian packages in apt's preferences and say what is left to install or hold."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_deb_pins
short_description: Pin a set of Debian packages at exact versions and say what is left to install or hold
description:
  - Writes I(path), apt's preferences file for the set (its I(content) rendered on the controller from the
    nvidia_repo role's C(pinned.pref.j2)), when its bytes differ, and reads every package of I(packages) with one
    C(dpkg-query), in one module run on the node.
  - Returns what is left - C(install), each C(name=version) not installed at its pin, and C(hold), each package
    not held now or about to be installed - so C(ansible.builtin.apt) and C(ansible.builtin.dpkg_selections) run
    only for what differs. On a node that already has the set (every converge after the first) both are skipped.
  - Why one module - the preferences file, then the read, cost two module runs on a node per set, and a converge
    pins six sets (plugins/module_utils/kimi_debs.py decides what is left).
options:
  path:
    description: apt's preferences file for this set (C(/etc/apt/preferences.d/<name>.pref)).
    type: path
    required: true
  content:
    description: The whole preferences file.
    type: str
    required: true
  packages:
    description: Package name to exact Debian version.
    type: dict
    required: true
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
attributes:
  check_mode:
    support: full
    details: Writes nothing, reads dpkg's state all the same and returns what a real run would have left to do.
  diff_mode:
    support: full
    details: The preferences file's content, owner, group and mode.
"""

EXAMPLES = r"""
- name: Pin nftables and read what is left to do
  kimi.k2.kimi_deb_pins:
    path: /etc/apt/preferences.d/kimi-nftables.pref
    content: "{{ lookup('ansible.builtin.template', 'pinned.pref.j2') }}"
    packages:
      nftables: 1.0.6-2+deb12u2
  register: pins

- name: Install what is not at its pin
  ansible.builtin.apt:
    name: "{{ pins.install }}"
  when: pins.install | length > 0
"""

RETURN = r"""
install:
  description: C(name=version) of every package not installed at its pin.
  returned: always
  type: list
  elements: str
  sample: [nftables=1.0.6-2+deb12u2]
hold:
  description: Every package not held now, or installed by the step that follows.
  returned: always
  type: list
  elements: str
  sample: [nftables]
"""

import subprocess
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_debs import DPKG_QUERY_FORMAT, pin_work
from ansible_collections.kimi.k2.plugins.module_utils.kimi_files import ensure_file


def dpkg_query(module: AnsibleModule, packages: list[str]) -> str:
    """dpkg-query's lines for the set; it exits 1 when it does not know a package at all (that one has no line)."""
    done = subprocess.run(
        ["dpkg-query", "--show", f"--showformat={DPKG_QUERY_FORMAT}", *packages],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode not in (0, 1):
        module.fail_json(msg=f"dpkg-query failed (rc {done.returncode}): {done.stderr.strip()}", changed=False)
    return done.stdout


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "content": {"type": "str", "required": True},
            # Free-form: package name to pinned version.
            "packages": {"type": "dict", "required": True},
        },
        supports_check_mode=True,
    )
    packages = {str(name): str(version) for name, version in module.params["packages"].items()}
    if not packages:
        module.fail_json(msg=f"packages is empty: nothing to pin in {module.params['path']}", changed=False)
    diffs: list[dict[str, Any]] = []
    preferences = {"dest": module.params["path"], "content": module.params["content"]}
    changed = ensure_file(module, {**preferences, "owner": "root", "group": "root", "mode": "0644"}, diffs)
    work = pin_work(dpkg_query(module, list(packages)), packages)
    result: dict[str, Any] = {"changed": changed, **work}
    if module._diff:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
