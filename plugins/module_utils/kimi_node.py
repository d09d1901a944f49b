"""Facts about one node that preflight needs: memory, CPUs, disks, interfaces, ports and who holds them.

Pure stdlib, read from /proc, /sys and the kernel's socket tables, so the same code runs on a GPU node, a lab
node and in unit tests (every reader takes its root directory, and tests point it at a fixture tree).
kimi_stack reads interfaces through read_links here too, so this must stay importable on the nodes' Python.
The apt sources (read only when asked: preflight needs them with an offline mirror) come from kimi_apt_sources.
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

from .kimi_apt_sources import read_apt_sources

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


# The one reader of a node's interfaces. Preflight (interfaces below) and the stack facts parity compares
# (kimi_stack.gather_interfaces) both view read_links, so they cannot disagree on which links exist or what
# they carry. Each view keeps its own shape and its own rule for "up" (IFF_UP here; ip's UP and LOWER_UP
# there): preflight's and parity's consumers, tests and recorded facts depend on both as they are.
SYS_CLASS_NET = Path("/sys/class/net")
IP_ADDR_COMMAND = ("ip", "-j", "addr", "show")
IFF_UP = 0x1  # include/uapi/linux/if.h: administratively up


def parse_ip_addr_json(text: str) -> dict[str, dict[str, Any]]:
    """`ip -j addr` as {ifname: {operstate, flags, ipv4: ['a.b.c.d/len']}}."""
    links: dict[str, dict[str, Any]] = {}
    for link in json.loads(text or "[]"):
        links[link["ifname"]] = {
            "operstate": str(link.get("operstate", "UNKNOWN")).lower(),
            "flags": list(link.get("flags", [])),
            "ipv4": [
                f"{addr['local']}/{addr.get('prefixlen', 32)}"
                for addr in link.get("addr_info", [])
                if addr.get("family") == "inet"
            ],
        }
    return links


def read_links(ip_addr_json: str, sys_class_net: Path = SYS_CLASS_NET) -> dict[str, dict[str, Any]]:
    """Every interface /sys/class/net or `ip -j addr` (its output, "" when ip failed) names, sorted by name.

    Each is {"sysfs": {"operstate", "flags"} or None, "ip": parse_ip_addr_json's record or None}, as read:
    the views decide what "up" means. A missing operstate file reads "unknown", a missing flags file None.
    """
    sysfs: dict[str, dict[str, str | None]] = {}
    for entry in sorted(sys_class_net.iterdir()) if sys_class_net.is_dir() else []:
        operstate, flags = entry / "operstate", entry / "flags"
        sysfs[entry.name] = {
            "operstate": operstate.read_text().strip() if operstate.exists() else "unknown",
            "flags": flags.read_text().strip() if flags.exists() else None,
        }
    ip_links = parse_ip_addr_json(ip_addr_json)
    return {name: {"sysfs": sysfs.get(name), "ip": ip_links.get(name)} for name in sorted(set(sysfs) | set(ip_links))}


def _ip_addr_json() -> str:
    """`ip -j addr show` output, "" when ip is missing or fails (iproute2 is on every node we support)."""
    try:
        return subprocess.run(list(IP_ADDR_COMMAND), capture_output=True, text=True, check=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def interfaces(sys_class_net: Path = SYS_CLASS_NET, ip_addr_json: str | None = None) -> dict:
    """Preflight's view: every interface the kernel has, its operstate, up, and bare IPv4 addresses."""
    links = read_links(_ip_addr_json() if ip_addr_json is None else ip_addr_json, sys_class_net)
    found = {}
    for name, link in links.items():
        if link["sysfs"] is None:
            continue  # a name only ip reported: preflight lists what /sys/class/net has
        operstate = link["sysfs"]["operstate"]
        flags = link["sysfs"]["flags"] or "0x0"
        found[name] = {
            "operstate": operstate,
            # IFF_UP: administratively up. Virtual links without carrier report operstate "unknown".
            "up": bool(int(flags, 16) & IFF_UP) and operstate in ("up", "unknown"),
            "ipv4": [address.partition("/")[0] for address in (link["ip"] or {}).get("ipv4", [])],
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
    apt_etc_path: str | None = None,
) -> dict[str, Any]:
    """Everything preflight evaluates for one node, in one pass; its apt sources too when apt_etc_path is given."""
    facts = {
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
    if apt_etc_path is not None:
        facts["apt_sources"] = read_apt_sources(Path(apt_etc_path))
    return facts
