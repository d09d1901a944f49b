#!/usr/bin/python
"""Ansible module: the node facts preflight checks (memory, disks, interfaces, ports and their holders, apt sources)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_node_info
short_description: Gather what preflight needs to know about one node, without changing it
description:
  - Reads RAM, CPU count, the filesystem holding the data directory (free bytes a service user can write),
    bytes of checkpoint already on disk, /dev/shm size, every network interface with its state and IPv4
    addresses, and whether each given TCP port can be bound (and which processes, with their systemd
    units, hold it when not).
  - With I(apt_sources), also every enabled apt source URI with the file and line it comes from, read as apt reads
    them (sources.list, and the *.list and deb822 *.sources files of sources.list.d), for preflight's check that an
    air-gapped node has no source but the offline mirror.
  - Read-only; identical in check mode.
options:
  data_path:
    description: Directory the checkpoint will live under (its filesystem is measured, even before it exists).
    type: str
    default: /data
  checkpoint_dir:
    description: Directory of the checkpoint itself; the bytes already there count as not missing.
    type: str
  shm_path:
    description: Shared-memory mount NCCL and vLLM use.
    type: str
    default: /dev/shm
  ports:
    description: TCP ports that must be free (or held by our own units) on this node.
    type: list
    elements: int
    default: []
  describe_pids:
    description: PIDs to describe (command line and systemd unit), e.g. the GPU compute processes.
    type: list
    elements: int
    default: []
  apt_sources:
    description: Read the node's enabled apt sources (returned as C(apt_sources)).
    type: bool
    default: false
  apt_etc_path:
    description: >-
      apt's configuration directory (Dir::Etc), holding sources.list and sources.list.d; read only with
      I(apt_sources).
    type: str
    default: /etc/apt
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.reads_only
"""

EXAMPLES = r"""
- name: Gather node facts for preflight
  kimi_node_info:
    data_path: /data
    checkpoint_dir: /data/models/Kimi-K2.7-Code
    ports: [8000, 29501]
  register: node_facts

- name: Gather node facts and the apt sources (an air-gapped site's preflight)
  kimi_node_info:
    data_path: /data
    apt_sources: true
  register: node_facts
"""

RETURN = r"""
memory_total_bytes:
  description: MemTotal in bytes.
  returned: success
  type: int
cpu_count:
  description: CPUs the kernel reports.
  returned: success
  type: int
data:
  description: path, exists, measured_at (nearest existing parent), total_bytes, free_bytes.
  returned: success
  type: dict
checkpoint_dir_bytes:
  description: Bytes of regular files already under checkpoint_dir (0 when absent).
  returned: success
  type: int
shm:
  description: The /dev/shm filesystem, same keys as data.
  returned: success
  type: dict
interfaces:
  description: Interface name to operstate, up and ipv4 list.
  returned: success
  type: dict
ports:
  description: Port (as a string) to free and holders (pid, cmdline, unit).
  returned: success
  type: dict
processes:
  description: PID (as a string) to cmdline, unit and exists.
  returned: success
  type: dict
apt_sources:
  description: >-
    Every enabled apt source URI, in apt's order, as C(file), C(line) (the entry's, or its URIs field's) and C(uri).
  returned: when apt_sources is true
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_node import gather


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "data_path": {"type": "str", "default": "/data"},
            "checkpoint_dir": {"type": "str"},
            "shm_path": {"type": "str", "default": "/dev/shm"},
            "ports": {"type": "list", "elements": "int", "default": []},
            "describe_pids": {"type": "list", "elements": "int", "default": []},
            "apt_sources": {"type": "bool", "default": False},
            "apt_etc_path": {"type": "str", "default": "/etc/apt"},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        facts = gather(
            params["data_path"],
            params["checkpoint_dir"],
            params["shm_path"],
            params["ports"],
            params["describe_pids"],
            apt_etc_path=params["apt_etc_path"] if params["apt_sources"] else None,
        )
    except (OSError, ValueError) as error:
        module.fail_json(msg=f"could not read node facts: {error}")
    module.exit_json(changed=False, **facts)


if __name__ == "__main__":
    main()
