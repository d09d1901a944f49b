#!/usr/bin/python
"""Ansible module: what the checkpoint download must fetch on a node, and whether its disk can take it."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_checkpoint_plan
short_description: Plan a node's checkpoint download - missing files and bytes, free space, the shortfall
description:
  - Compares the listed files with what is on disk and reports the missing files and bytes, the free space of
    the filesystem that holds the directory (its nearest existing ancestor before the directory is made) and,
    when the missing bytes plus I(margin_bytes) do not fit, a C(shortfall) message naming the host, the path and
    both numbers.
  - With I(repair) it first deletes the files at a wrong size and those a failed verification recorded as bad
    (kimi_checkpoint_verify writes that record in I(state_dir)), so the download fetches them again; hf
    restarts an interrupted file from zero, so a wrong size counts in full.
options:
  dir:
    description: The checkpoint directory.
    type: path
    required: true
  files:
    description: Files as kimi_hf_repo_files returns them (path, size, sha256, git_oid).
    type: list
    elements: dict
    required: true
  host:
    description: Host name the shortfall message starts with.
    type: str
    default: node
  margin_bytes:
    description: Free space kept on top of the missing bytes.
    type: int
    default: 0
  repair:
    description: Delete files at a wrong size and those recorded as bad first.
    type: bool
    default: false
  state_dir:
    description: Node-local directory of the download job's pid and of the bad-file record.
    type: path
  script:
    description: The download script, to tell whether its job is running.
    type: path
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
attributes:
  check_mode:
    support: full
    details: In check mode nothing is deleted; the files that would be are counted as missing.
  diff_mode:
    support: none
    details: Its only change is files deleted; C(removed) names them.
"""

EXAMPLES = r"""
- name: Plan the download (deletes files at a wrong size and files a verification found bad)
  kimi_checkpoint_plan:
    dir: /data/models/kimi-k2.7-code
    files: "{{ repo.files }}"
    state_dir: /var/lib/kimi-checkpoint
    margin_bytes: 10737418240
    host: "{{ inventory_hostname }}"
    repair: true
  register: checkpoint_plan
"""

RETURN = r"""
shortfall:
  description: Why the disk cannot take the download (host, path, bytes missing, margin, free); null if it can.
  returned: always
  type: str
removed:
  description: The files deleted (or that would be, in check mode) by I(repair).
  returned: always
  type: list
  elements: str
missing:
  description: Files still to download.
  returned: always
  type: list
  elements: str
missing_bytes:
  description: Their listed bytes.
  returned: always
  type: int
total_bytes:
  description: Bytes of every listed file.
  returned: always
  type: int
present_bytes:
  description: Bytes of the listed files already on disk at their size.
  returned: always
  type: int
free_bytes:
  description: Free bytes where the directory lives.
  returned: always
  type: int
filesystem_path:
  description: The path whose filesystem was measured.
  returned: always
  type: str
running:
  description: The download job is alive.
  returned: always
  type: bool
"""

from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_checkpoint_node import download_plan, repo_files


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "dir": {"type": "path", "required": True},
            "files": {"type": "list", "elements": "dict", "required": True},
            "host": {"type": "str", "default": "node"},
            "margin_bytes": {"type": "int", "default": 0},
            "repair": {"type": "bool", "default": False},
            "state_dir": {"type": "path"},
            "script": {"type": "path"},
        },
        supports_check_mode=True,
    )
    params = module.params
    result = download_plan(
        Path(params["dir"]),
        repo_files(params["files"]),
        params["host"] or "node",
        params["margin_bytes"],
        state_dir=Path(params["state_dir"]) if params["state_dir"] else None,
        repair=params["repair"],
        check_mode=module.check_mode,
        script=params["script"],
    )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
