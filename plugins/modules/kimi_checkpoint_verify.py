#!/usr/bin/python
"""Ansible module: verify a node's checkpoint files against the Hub's sizes and checksums."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_checkpoint_verify
short_description: Verify every checkpoint file's size, and its sha256 or git blob id where the Hub gave one
description:
  - Checks every listed file's size, and its content (sha256 for LFS files, the git blob id for the others)
    where the Hub listed one; with I(only), the content of those files alone.
  - Bad files are recorded in I(state_dir) so that the next kimi_checkpoint_plan with I(repair) deletes them.
  - Returns each file's marker entry (Hub checksum and stat after hashing) for the role to write.
  - Never reports a change; the record of bad files is the repair's input, not a change to the checkpoint.
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
  checksums:
    description: Check contents, not only sizes.
    type: bool
    default: true
  only:
    description: Check the content of these paths only (sizes are checked for all); null = all.
    type: list
    elements: str
  state_dir:
    description: Where the bad-file record is written.
    type: path
  arrival_record:
    description:
      - The fetch program's fetch-checked.json (files it checked against their checksum as it took them from a
        peer, with their stat once in place). The content of such a file is not hashed again while its size, mtime
        and inode are as recorded; its size still is checked. Missing or unreadable, every file is hashed.
    type: path
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
attributes:
  check_mode:
    support: full
    details: In check mode the files are verified but no bad-file record is written.
  diff_mode:
    support: none
    details: It changes nothing a diff could show.
"""

EXAMPLES = r"""
- name: Verify every file
  kimi_checkpoint_verify:
    dir: /data/models/kimi-k2.7-code
    files: "{{ repo.files }}"
    state_dir: /var/lib/kimi-checkpoint
  register: checkpoint_verify
"""

RETURN = r"""
ok:
  description: Every file passed.
  returned: always
  type: bool
problems:
  description: One line per bad file.
  returned: always
  type: list
  elements: str
bad:
  description: The paths of the bad files.
  returned: always
  type: list
  elements: str
hashed:
  description: How many files had their content checked.
  returned: always
  type: int
checked_on_arrival:
  description: How many files the fetch program had checked on arrival, and were not hashed again.
  returned: always
  type: int
files:
  description: Path to its marker entry (sha256, git_oid, size, mtime_ns, ino) for every file on disk.
  returned: always
  type: dict
marker_version:
  description: The marker version to write with these entries.
  returned: always
  type: int
"""

from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_checkpoint_node import (
    read_arrival_record,
    repo_files,
    run_verification,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "dir": {"type": "path", "required": True},
            "files": {"type": "list", "elements": "dict", "required": True},
            "checksums": {"type": "bool", "default": True},
            "only": {"type": "list", "elements": "str"},
            "state_dir": {"type": "path"},
            "arrival_record": {"type": "path"},
        },
        supports_check_mode=True,
    )
    params = module.params
    result = run_verification(
        Path(params["dir"]),
        repo_files(params["files"]),
        params["checksums"],
        params["only"],
        state_dir=Path(params["state_dir"]) if params["state_dir"] else None,
        check_mode=module.check_mode,
        arrival=read_arrival_record(Path(params["arrival_record"]) if params["arrival_record"] else None),
    )
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
