#!/usr/bin/python
"""Ansible module: a role's directories and files on a node in one module run (content rendered on the controller)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_files
short_description: Create a role's directories and write its files on a node in one module run
description:
  - Creates each of I(directories) that is missing and writes each of I(files) whose bytes differ, then sets the
    owner, group and mode of each where they differ, all in one module run on the node.
  - The content is rendered on the controller, by the task, with C(lookup('ansible.builtin.template', ...)) or
    C(lookup('ansible.builtin.file', ..., rstrip=false)), so a role's templates stay where they are.
  - Why not C(ansible.builtin.template) per file - each of those pays two module runs on the node even when nothing
    changes (a stat, then C(file) for the attributes); a role writing eight files paid sixteen. Ansible has no task
    that writes several files in one run.
  - A file is written to a temporary file beside its destination, checked with I(validate) when given, and renamed
    over the destination, so a reader sees the old file or the new one. A failing check leaves the old file.
  - Directories come first, so a file may go into a directory the same call creates.
options:
  directories:
    description: Directories that must exist (parents are created too).
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: The directory.
        type: path
        required: true
      owner:
        description: Its owner (unchanged when omitted).
        type: str
      group:
        description: Its group (unchanged when omitted).
        type: str
      mode:
        description: Its mode, as a string such as C("0755") (as created when omitted).
        type: raw
  files:
    description: Files and the exact content each must hold.
    type: list
    elements: dict
    default: []
    suboptions:
      dest:
        description: The file.
        type: path
        required: true
      content:
        description: Its whole content (say the final newline yourself; a template lookup keeps it).
        type: str
        required: true
      owner:
        description: Its owner (unchanged when omitted).
        type: str
      group:
        description: Its group (unchanged when omitted).
        type: str
      mode:
        description: Its mode, as a string such as C("0644").
        type: raw
      validate:
        description: >-
          A command run on the new content before it replaces the file, C(%s) standing for the candidate file's
          path, as in C(ansible.builtin.template). A non-zero exit fails the task and keeps the old file.
        type: str
notes:
  - A path named twice in one call is refused (which entry won would depend on the order), but for a directory
    given twice with the same owner, group and mode.
  - Give the task C(no_log) when a file holds a secret; C(--diff) then shows nothing either.
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
attributes:
  check_mode:
    support: full
    details: Reports every directory and file it would create or change, and writes nothing.
  diff_mode:
    support: full
    details: One diff per changed file's content, and one per changed owner, group or mode.
"""

EXAMPLES = r"""
- name: Write the watchdog's directories, config and units
  kimi.k2.kimi_files:
    directories:
      - path: /etc/kimi
        mode: "0755"
    files:
      - dest: /etc/kimi/watchdog.json
        content: "{{ lookup('ansible.builtin.template', 'watchdog.json.j2') }}"
        mode: "0644"
      - dest: /etc/prometheus/rules/kimi.yml
        content: "{{ lookup('ansible.builtin.template', 'rules.yml.j2') }}"
        validate: promtool check rules %s
  notify: Restart the watchdog
  register: watchdog_files

- name: Reload systemd only when a unit file changed
  ansible.builtin.systemd_service:
    daemon_reload: true
  when: "'/etc/systemd/system/kimi-watchdog.service' in watchdog_files.changed_paths"
"""

RETURN = r"""
changed_paths:
  description: The directories created and the files written or whose owner, group or mode changed (or would be, in
    check mode), in the order given.
  returned: always
  type: list
  elements: str
  sample: [/etc/kimi, /etc/kimi/watchdog.json]
"""

from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_files import (
    distinct_directories,
    duplicate_paths,
    ensure_directory,
    ensure_file,
)

ATTRIBUTE_OPTIONS = {"owner": {"type": "str"}, "group": {"type": "str"}, "mode": {"type": "raw"}}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "directories": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": {"path": {"type": "path", "required": True}, **ATTRIBUTE_OPTIONS},
            },
            "files": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": {
                    "dest": {"type": "path", "required": True},
                    "content": {"type": "str", "required": True},
                    "validate": {"type": "str"},
                    **ATTRIBUTE_OPTIONS,
                },
            },
        },
        supports_check_mode=True,
    )
    directories, files = distinct_directories(module.params["directories"]), module.params["files"]
    repeated = duplicate_paths(directories, files)
    if repeated:
        module.fail_json(msg=f"named more than once in one call: {', '.join(repeated)}", changed_paths=[])
    diffs: list[dict[str, Any]] = []
    changed_paths = [entry["path"] for entry in directories if ensure_directory(module, entry, diffs)]
    changed_paths += [entry["dest"] for entry in files if ensure_file(module, entry, diffs)]
    result: dict[str, Any] = {"changed": bool(changed_paths), "changed_paths": changed_paths}
    if module._diff:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
