"""Facts about one node that preflight needs: memory, CPUs, disks, interfaces, ports and who holds them.

Pure stdlib, read from /proc, /sys and the kernel's socket tables, so the same code runs on a GPU node, a lab
node and in unit tests (every reader takes its root directory, and tests point it at a fixture tree).
"""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

TCP_LISTEN_STATE = "0A"


def memory_total_bytes(proc: Path = Path("/proc")) -> int:
    """MemTotal from /proc/meminfo, in bytes."""
    for line in (proc / "meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"{proc / 'meminfo'} has no MemTotal line")


def filesystem_usage(path: str) -> dict[str, Any]:
    """Size and free bytes of the filesystem that holds ``path`` (its nearest existing parent if absent)."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    stats = os.statvfs(probe)
    return {
        "path": path,
        "exists": Path(path).exists(),
        "measured_at": str(probe),
        "total_bytes": stats.f_blocks * stats.f_frsize,
        # f_bavail, not f_bfree: what an unprivileged service user can actually write.
        "free_bytes": stats.f_bavail * stats.f_frsize,
    }


def directory_bytes(path: str) -> int:
    """Bytes of regular files under ``path`` (0 when it does not exist); symlinks are not followed."""
    root = Path(path)
    if not root.is_dir():
        return 0
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            entry = Path(dirpath) / name
            if entry.is_file() and not entry.is_symlink():
                total += entry.stat().st_size
    return total


def _ipv4_by_interface() -> dict[str, list[str]]:
    """IPv4 addresses per interface from `ip -j addr` (iproute2 is on every node we support)."""
    try:
        output = subprocess.run(
            ["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True, check=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    addresses: dict[str, list[str]] = {}
    for link in json.loads(output or "[]"):
        addresses[link["ifname"]] = [a["local"] for a in link.get("addr_info", []) if a.get("family") == "inet"]
    return addresses


def interfaces(sys_class_net: Path = Path("/sys/class/net"), ipv4: dict[str, list[str]] | None = None) -> dict:
    """Every interface with its operational state and IPv4 addresses."""
    ipv4 = _ipv4_by_interface() if ipv4 is None else ipv4
    found = {}
    for entry in sorted(sys_class_net.iterdir()) if sys_class_net.is_dir() else []:
        operstate = (entry / "operstate").read_text().strip() if (entry / "operstate").exists() else "unknown"
        flags = (entry / "flags").read_text().strip() if (entry / "flags").exists() else "0x0"
        found[entry.name] = {
            "operstate": operstate,
            # IFF_UP (0x1): administratively up. Virtual links without carrier report operstate "unknown".
            "up": bool(int(flags, 16) & 0x1) and operstate in ("up", "unknown"),
            "ipv4": ipv4.get(entry.name, []),
        }
    return found


def _listening_inodes(proc: Path, port: int) -> set[str]:
    """Socket inodes listening on ``port`` (IPv4 and IPv6 tables)."""
    inodes = set()
    for table in ("net/tcp", "net/tcp6"):
        path = proc / table
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == TCP_LISTEN_STATE and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes


def _links_of(descriptors: list[Path]) -> set[str]:
    """Targets of file-descriptor links; a descriptor closed while we look is skipped, not fatal."""
    links = set()
    for descriptor in descriptors:
        try:
            links.add(str(descriptor.readlink()))
        except OSError:
            continue
    return links


def _pids_holding(proc: Path, inodes: set[str]) -> list[int]:
    """PIDs with an open file descriptor on one of these socket inodes."""
    wanted = {f"socket:[{inode}]" for inode in inodes}
    holders = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            descriptors = list((entry / "fd").iterdir())
        except OSError:
            continue  # gone, or not ours to read
        if _links_of(descriptors) & wanted:
            holders.append(int(entry.name))
    return sorted(holders)


def describe_pid(pid: int, proc: Path = Path("/proc")) -> dict[str, Any]:
    """Command line and systemd unit of a process (the unit tells ours from a stranger's)."""
    base = proc / str(pid)
    try:
        cmdline = (base / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        cgroup = (base / "cgroup").read_text()
    except OSError:
        return {"pid": pid, "cmdline": "", "unit": None, "exists": False}
    return {"pid": pid, "cmdline": cmdline, "unit": unit_from_cgroup(cgroup), "exists": True}


def unit_from_cgroup(cgroup_text: str) -> str | None:
    """The innermost .service (or .scope) in a /proc/PID/cgroup listing, if any."""
    for line in cgroup_text.splitlines():
        path = line.split(":", 2)[-1]
        units = [part for part in path.split("/") if part.endswith((".service", ".scope"))]
        if units:
            return units[-1]
    return None


def port_is_free(port: int, address: str = "0.0.0.0") -> bool:
    """Whether a TCP listener could bind ``address:port`` right now (the real test vLLM will face)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError as error:
            if error.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def port_status(port: int, proc: Path = Path("/proc")) -> dict[str, Any]:
    """Free or not, and which processes (with their units) hold it when not."""
    if port_is_free(port):
        return {"port": port, "free": True, "holders": []}
    holders = [describe_pid(pid, proc) for pid in _pids_holding(proc, _listening_inodes(proc, port))]
    return {"port": port, "free": False, "holders": holders}


def matches_any(unit: str | None, patterns: list[str]) -> bool:
    """Whether a unit name matches one of the shell-style patterns (our own services)."""
    return bool(unit) and any(fnmatch.fnmatchcase(unit, pattern) for pattern in patterns)


def gather(
    data_path: str,
    checkpoint_dir: str | None,
    shm_path: str,
    ports: list[int],
    describe_pids: list[int],
) -> dict[str, Any]:
    """Everything preflight evaluates for one node, in one pass."""
    return {
        "memory_total_bytes": memory_total_bytes(),
        "cpu_count": os.cpu_count() or 0,
        "data": filesystem_usage(data_path),
        "checkpoint_dir_bytes": directory_bytes(checkpoint_dir) if checkpoint_dir else 0,
        "shm": filesystem_usage(shm_path),
        "interfaces": interfaces(),
        "ports": {str(port): port_status(port) for port in ports},
        "processes": {str(pid): describe_pid(pid) for pid in describe_pids},
        "hostname": socket.gethostname(),
    }
