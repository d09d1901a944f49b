#!/usr/bin/python
"""Ansible module: what the checkpoint marker on a node records, and which recorded files changed since."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_checkpoint_info
short_description: Read a node's checkpoint marker and find the recorded files that changed since verification
description:
  - Reads the marker and says whether it records this repository, commit and patterns; it does not list the
    checkpoint directory.
  - Stats every file the marker records (size, mtime_ns, inode) and names those missing or changed since
    their verification (C(stale)), so a finished checkpoint costs one small read and a stat per file.
  - With I(sample_files) it also hashes that many recorded files, chosen by I(sample_index), against the Hub
    checksum the marker records (drift's rotating sample).
  - Reads only; changes nothing.
options:
  dir:
    description: The checkpoint directory.
    type: path
    required: true
  marker:
    description: Marker file name inside I(dir).
    type: str
    default: .kimi-checkpoint.json
  repo_id:
    description: The pinned repository; C(matches) is false unless the marker records it.
    type: str
  revision:
    description: The pinned commit.
    type: str
  include:
    description: The pinned include patterns.
    type: list
    elements: str
    default: []
  exclude:
    description: The pinned exclude patterns.
    type: list
    elements: str
    default: []
  sample_files:
    description: Recorded files to hash against the marker's checksums; 0 = none.
    type: int
    default: 0
  sample_index:
    description: Which window of I(sample_files) files (in name order, wrapping) to hash.
    type: int
    default: 0
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.reads_only
"""

EXAMPLES = r"""
- name: Is the checkpoint already there
  kimi_checkpoint_info:
    dir: /data/models/kimi-k2.7-code
    repo_id: moonshotai/Kimi-K2.7-Code
    revision: 0123456789abcdef0123456789abcdef01234567
  register: checkpoint_marker
"""

RETURN = r"""
marker:
  description: The marker as read; null when there is none or it is not valid JSON.
  returned: always
  type: dict
matches:
  description: The marker records this repo, commit and patterns.
  returned: always
  type: bool
old_version:
  description: The marker is of an earlier version, without file stats.
  returned: always
  type: bool
files_recorded:
  description: Number of files with a stat in the marker.
  returned: always
  type: int
stale:
  description: One line per recorded file missing or changed (size, mtime_ns, inode) since verification.
  returned: always
  type: list
  elements: str
stale_paths:
  description: Their paths.
  returned: always
  type: list
  elements: str
sampled:
  description: The files hashed for the sample.
  returned: always
  type: list
  elements: str
sample_problems:
  description: One line per sampled file not matching its recorded checksum.
  returned: always
  type: list
  elements: str
"""

from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_checkpoint_node import marker_state


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "dir": {"type": "path", "required": True},
            "marker": {"type": "str", "default": ".kimi-checkpoint.json"},
            "repo_id": {"type": "str"},
            "revision": {"type": "str"},
            "include": {"type": "list", "elements": "str", "default": []},
            "exclude": {"type": "list", "elements": "str", "default": []},
            "sample_files": {"type": "int", "default": 0},
            "sample_index": {"type": "int", "default": 0},
        },
        supports_check_mode=True,
    )
    params = module.params
    pin = {key: params[key] for key in ("repo_id", "revision", "include", "exclude")}
    state = marker_state(Path(params["dir"]), params["marker"], pin, params["sample_files"], params["sample_index"])
    module.exit_json(changed=False, **state)


if __name__ == "__main__":
    main()
