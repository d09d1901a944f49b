"""`down` and its check: remove everything a lab (or a half-made one) put on the host, and list what is left.

Teardown does not trust the record `up` wrote: it looks for the lab's traces on the host itself (cgroups,
pid files, mounts under the state dir, links, the iptables chain, loop devices), so it also cleans up after
an `up` that died half-way.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from pathlib import Path

from . import inventory, net, nodes, serve
from .settings import CGROUP_NAME, CGROUP_ROOTS
from .state import StatePaths
from .system import (
    LabError,
    cgroup_pids,
    mounts_under,
    process_cmdline,
    remove_cgroup_tree,
    remove_tree,
    signal_pids,
    unmount_all_under,
    wait_until_gone,
)

NSPAWN_PROPAGATE = Path("/run/systemd/nspawn/propagate")


def _node_names(paths: StatePaths) -> list[str]:
    names = set()
    for root in CGROUP_ROOTS:
        group = root / CGROUP_NAME
        if group.is_dir():
            names |= {p.name for p in group.iterdir() if p.is_dir() and p.name.startswith("node")}
    nodes_dir = paths.root / "nodes"
    if nodes_dir.is_dir():
        names |= {p.name for p in nodes_dir.iterdir() if p.is_dir()}
    return sorted(names)


def loop_devices(backing_under: list[Path]) -> list[str]:
    """Loop devices whose backing file lies under one of the given directories."""
    proc = subprocess.run(["losetup", "--json", "--list"], capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        return []
    found = []
    for device in json.loads(proc.stdout).get("loopdevices", []):
        backing = device.get("back-file") or ""
        if any(backing.startswith(str(directory) + "/") for directory in backing_under):
            found.append(device["name"])
    return found


def down(paths: StatePaths) -> list[str]:
    """Tear the lab down, each step regardless of the ones before; returns what could not be removed."""
    problems: list[str] = []
    serve.stop_servers(paths)
    nodes.stop_all(paths, _node_names(paths))
    # A process an interrupted `up` started but never recorded is found by its command line instead.
    strays = _lab_processes(paths)
    signal_pids(strays, signal.SIGKILL)
    wait_until_gone(strays, 5)
    # nspawn removes its machine's propagation directory on exit, but not when it was SIGKILLed.
    for directory in sorted(NSPAWN_PROPAGATE.glob("node*")):
        try:
            remove_tree(directory)
        except (LabError, OSError) as error:
            problems.append(f"cannot remove {directory}: {error}")
    problems += unmount_all_under(paths.root)
    problems += net.delete_links()
    problems += net.delete_chain()
    problems += net.delete_airgap_chain()
    for root in CGROUP_ROOTS:
        problems += remove_cgroup_tree(root / CGROUP_NAME)
    for device in loop_devices([paths.root]):
        subprocess.run(["losetup", "-d", device], capture_output=True, check=False)
    inventory.remove()
    if not mounts_under(paths.root):
        try:
            remove_tree(paths.root)
        except (LabError, OSError) as error:
            problems.append(f"cannot remove {paths.root}: {error}")
    return problems + leftovers(paths)


def leftovers(paths: StatePaths) -> list[str]:
    """Everything of the lab still on the host; empty after a complete `down`. Each entry names one thing."""
    found: list[str] = []
    for root in CGROUP_ROOTS:
        group = root / CGROUP_NAME
        if group.exists():
            found.append(f"cgroup {group}")
            found += [f"process {pid} ({' '.join(process_cmdline(pid))[:80]})" for pid in cgroup_pids(group)]
    found += [f"lab process {pid} ({' '.join(process_cmdline(pid))[:80]})" for pid in _lab_processes(paths)]
    found += [f"{name} server process {pid}" for name, pid in serve.server_pids(paths).items() if pid]
    found += [f"mount {m}" for m in mounts_under(paths.root)]
    found += [f"link {name}" for name in net.lab_links()]
    if net.chain_exists():
        found.append(f"iptables chain {net.IPTABLES_CHAIN}")
    if net.forward_jumps():
        found.append(f"iptables FORWARD jump to {net.IPTABLES_CHAIN}")
    if net.airgap_chain_exists():
        found.append(f"iptables chain {net.AIRGAP_CHAIN}")
    if net.input_jumps():
        found.append(f"iptables INPUT jump to {net.AIRGAP_CHAIN}")
    found += [f"loop device {device}" for device in loop_devices([paths.root])]
    found += [f"pid file {p}" for p in paths.pid_files()]
    found += [f"inventory file {p}" for p in (inventory.hosts_path(), inventory.generated_vars_path()) if p.exists()]
    if paths.root.is_dir() and any(paths.root.iterdir()):
        found.append(f"state directory {paths.root}")
    # nspawn's per-machine mount propagation directory outlives it only if nspawn itself was killed.
    found += [f"nspawn directory {d}" for d in sorted(NSPAWN_PROPAGATE.glob("node*"))]
    return found


def save_logs(paths: StatePaths, destination: Path) -> Path:
    """Copy the servers' logs and the nodes' consoles out of the state dir before a failed up removes it."""
    remove_tree(destination)
    destination.mkdir(parents=True)
    if paths.logs.is_dir():
        shutil.copytree(paths.logs, destination / "logs")
    for console in sorted((paths.root / "nodes").glob("*/console.log")):
        shutil.copyfile(console, destination / f"{console.parent.name}-console.log")
    return destination


def _lab_processes(paths: StatePaths) -> list[int]:
    """Lab processes found by their command line rather than a pid file or cgroup: an nspawn (or the shell
    about to exec it) booting a directory under the state dir, or a server serving from it. This catches
    what an `up` killed between starting a process and recording it leaves running."""
    node_marker = f"--directory={paths.root}/"
    serve_marker = f"{paths.serve_dir}/"
    pids = []
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit():
            continue
        argv = process_cmdline(int(proc_dir.name))
        is_node = any(arg.startswith(node_marker) for arg in argv)
        is_server = any(arg in (serve.HTTP_MARKER, serve.OLAH_MARKER) for arg in argv) and any(
            arg.startswith(serve_marker) for arg in argv
        )
        if is_node or is_server:
            pids.append(int(proc_dir.name))
    return pids
