"""Lab nodes: systemd-nspawn containers booting real systemd, one overlayfs layer each over the shared base.

A node's files live in StatePaths.node_dir(name): the overlay upper/work dirs (kept across crash + start),
the sized tmpfs that becomes /data, its ssh host key, nspawn's pid file and console log.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

from . import net
from .settings import (
    BRIDGE,
    CGROUP_NAME,
    CGROUP_ROOTS,
    HOST_ADDRESS,
    PREFIX_LENGTH,
    node_address,
    node_index,
    node_name,
    node_veth,
)
from .state import StatePaths
from .system import (
    LabError,
    cgroup_pids,
    critical_section,
    is_mounted,
    namespace_pid,
    pid_file_process,
    process_alive,
    read_pid_file,
    run,
    signal_pids,
    wait_until_gone,
)

SSH_PORT = 22


# --- what a node is told about itself (pure; unit-tested) ---------------------------------------------------


def render_hosts(own_name: str, node_count: int) -> str:
    """/etc/hosts as a Debian install writes it (own name on 127.0.1.1, a real trap multi-node software must
    survive), plus every lab node and the lab host."""
    lines = [
        "127.0.0.1\tlocalhost",
        f"127.0.1.1\t{own_name}",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        "ff02::1\tip6-allnodes",
        "ff02::2\tip6-allrouters",
        "",
        "# The lab (written by lab/lab)",
        f"{HOST_ADDRESS}\tlab-host",
    ]
    lines += [f"{node_address(i)}\t{node_name(i)}" for i in range(1, node_count + 1)]
    return "\n".join(lines) + "\n"


def render_network(index: int) -> str:
    """systemd-networkd config for the container side of the veth: a static address, no gateway (the only
    route is the bridge's /24, so nothing a node sends can leave the lab)."""
    return f"[Match]\nName=host0\n\n[Network]\nAddress={node_address(index)}/{PREFIX_LENGTH}\nIPv6AcceptRA=no\n"


def render_apt_source(http_port: int) -> str:
    return f"deb [trusted=yes] http://{HOST_ADDRESS}:{http_port}/apt/debian ./\n"


def render_known_hosts_line(index: int, host_public_key: str) -> str:
    """One known_hosts entry naming the node by name and address (Ansible connects by address)."""
    key_type, key_blob = host_public_key.split()[:2]
    return f"{node_name(index)},{node_address(index)} {key_type} {key_blob}\n"


def new_machine_id() -> str:
    return uuid.uuid4().hex


# --- identity on disk ------------------------------------------------------------------------------------


def ensure_host_key(paths: StatePaths, name: str) -> str:
    """The node's ed25519 host key, generated once (kept across crash + start so known_hosts stays valid)."""
    key = paths.node_host_key(name)
    if not key.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{name}", "-f", str(key)])
    return key.with_suffix(".pub").read_text()


def ensure_client_key(paths: StatePaths) -> str:
    paths.ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not paths.client_key.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "kimi-lab", "-f", str(paths.client_key)])
    return paths.client_key.with_suffix(".pub").read_text()


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def write_identity(paths: StatePaths, index: int, node_count: int, http_port: int, client_public_key: str) -> None:
    """Everything that makes node K itself, written into its overlay before its first boot."""
    name = node_name(index)
    root = paths.node_root(name)
    _write(root / "etc/hostname", f"{name}\n")
    _write(root / "etc/machine-id", f"{new_machine_id()}\n", 0o444)
    _write(root / "etc/hosts", render_hosts(name, node_count))
    _write(root / "etc/systemd/network/10-lab-host0.network", render_network(index))
    _write(root / "etc/apt/sources.list.d/lab-debian.list", render_apt_source(http_port))
    ensure_host_key(paths, name)
    key = paths.node_host_key(name)
    shutil.copyfile(key, root / "etc/ssh/ssh_host_ed25519_key")
    (root / "etc/ssh/ssh_host_ed25519_key").chmod(0o600)
    shutil.copyfile(key.with_suffix(".pub"), root / "etc/ssh/ssh_host_ed25519_key.pub")
    (root / "root/.ssh").mkdir(mode=0o700, exist_ok=True)
    _write(root / "root/.ssh/authorized_keys", client_public_key, 0o600)


def write_known_hosts(paths: StatePaths, node_count: int) -> None:
    lines = [
        render_known_hosts_line(i, paths.node_host_key(node_name(i)).with_suffix(".pub").read_text())
        for i in range(1, node_count + 1)
    ]
    _write(paths.known_hosts, "".join(lines))


# --- filesystems -----------------------------------------------------------------------------------------


def mount_data(paths: StatePaths, name: str, size_bytes: int) -> None:
    """A sized tmpfs on the host, bound into the node as /data: df and statvfs inside see the real limit,
    it survives crash + start (the host keeps it), and resizing is one remount."""
    data = paths.node_data(name)
    data.mkdir(parents=True, exist_ok=True)
    if not is_mounted(data):
        run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0755", f"kimi-lab-{name}-data", str(data)])


def resize_data(paths: StatePaths, name: str, size_bytes: int) -> None:
    data = paths.node_data(name)
    if not is_mounted(data):
        raise LabError(f"{name} has no /data mounted (is the lab up?)", exit_code=2)
    # The node's /data is a bind of this same tmpfs superblock, so the new limit applies inside at once.
    proc = subprocess.run(
        ["mount", "-o", f"remount,size={size_bytes}", str(data)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        # The kernel refuses to shrink a tmpfs below what it holds; mount's own message does not say so.
        used = shutil.disk_usage(data).used
        raise LabError(f"cannot resize {name}'s /data to {size_bytes} bytes: {used} bytes are in use", exit_code=2)


def mount_overlay(paths: StatePaths, name: str, base_rootfs: Path) -> None:
    root, upper, work = paths.node_root(name), paths.node_upper(name), paths.node_work(name)
    for directory in (root, upper, work):
        directory.mkdir(parents=True, exist_ok=True)
    if not is_mounted(root):
        options = f"lowerdir={base_rootfs},upperdir={upper},workdir={work}"
        run(["mount", "-t", "overlay", "-o", options, f"kimi-lab-{name}", str(root)])


# --- processes -------------------------------------------------------------------------------------------


def node_cgroups(name: str) -> list[Path]:
    return [root / CGROUP_NAME / name for root in CGROUP_ROOTS]


def nspawn_argv(paths: StatePaths, name: str) -> list[str]:
    return [
        "systemd-nspawn",
        # The host has no systemd/machined to register with or to create a scope unit: run in our cgroup.
        "--register=no",
        "--keep-unit",
        "--boot",
        f"--directory={paths.node_root(name)}",
        f"--machine={name}",
        f"--network-bridge={BRIDGE}",
        f"--bind={paths.node_data(name)}:/data",
        "--resolv-conf=off",
        "--timezone=off",
        "--link-journal=no",
        "--console=read-only",
    ]


def launch(paths: StatePaths, name: str) -> int:
    """Start the node's nspawn in its own cgroup and session; returns nspawn's pid (written to its pid file).

    With --keep-unit nspawn puts the container under the caller's cgroup, so the launching shell first moves
    itself into the node's cgroup (one per node: otherwise every node shares one payload group)."""
    cgroups = node_cgroups(name)
    for cgroup in cgroups:
        cgroup.mkdir(parents=True, exist_ok=True)
    move = " && ".join(f"echo $$ > {cgroup / 'cgroup.procs'}" for cgroup in cgroups)
    script = f'{move} && exec "$@"'
    with paths.node_console_log(name).open("ab") as console, critical_section():
        proc = subprocess.Popen(
            ["sh", "-c", script, "sh", *nspawn_argv(paths, name)],
            stdin=subprocess.DEVNULL,
            stdout=console,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        paths.node_pid_file(name).write_text(f"{proc.pid}\n")
    return proc.pid


def nspawn_pid(paths: StatePaths, name: str) -> int | None:
    return pid_file_process(paths.node_pid_file(name), "systemd-nspawn")


def container_init_pid(name: str) -> int | None:
    """The host pid of the node's PID 1 (systemd): the process in its cgroup that is pid 1 of a nested pid
    namespace."""
    for pid in cgroup_pids(node_cgroups(name)[0]):
        nested = namespace_pid(pid)
        if len(nested) > 1 and nested[-1] == 1:
            return pid
    return None


def is_running(paths: StatePaths, name: str) -> bool:
    return nspawn_pid(paths, name) is not None


def crash(paths: StatePaths, name: str) -> None:
    """Power cut: SIGKILL the node's PID 1. The kernel kills its whole pid namespace, nspawn exits and removes
    the veth; the overlay and /data stay mounted on the host with whatever had reached them."""
    init = container_init_pid(name)
    nspawn = nspawn_pid(paths, name)
    if init is None and nspawn is None:
        raise LabError(f"{name} is not running", exit_code=2)
    if init is not None:
        signal_pids([init], signal.SIGKILL)
    if nspawn is not None and wait_until_gone([nspawn], 10):
        # nspawn did not notice (it should); do not leave it holding the node directory.
        signal_pids([nspawn], signal.SIGKILL)
        wait_until_gone([nspawn], 5)
    leftover = cgroup_pids(node_cgroups(name)[0])
    signal_pids(leftover, signal.SIGKILL)
    wait_until_gone(leftover, 5)
    paths.node_pid_file(name).unlink(missing_ok=True)


def stop_all(paths: StatePaths, names: list[str], timeout_s: float = 10) -> None:
    """Orderly shutdown of every node at once (nspawn turns SIGTERM into a poweroff request to systemd),
    then SIGKILL whatever is still in the nodes' cgroups."""
    pids = [pid for pid in (nspawn_pid(paths, name) for name in names) if pid is not None]
    signal_pids(pids, signal.SIGTERM)
    wait_until_gone(pids, timeout_s)
    for name in names:
        stragglers = cgroup_pids(node_cgroups(name)[0]) + cgroup_pids(node_cgroups(name)[1])
        signal_pids(sorted(set(stragglers)), signal.SIGKILL)
        wait_until_gone(stragglers, 5)
        paths.node_pid_file(name).unlink(missing_ok=True)


def state_of(paths: StatePaths, name: str) -> str:
    """running / cut (running, veth down) / crashed (not running, state kept)."""
    if not is_running(paths, name):
        return "crashed"
    veth = node_veth(name)
    if net.link_exists(veth) and not net.link_is_up(veth):
        return "cut"
    return "running"


# --- readiness -------------------------------------------------------------------------------------------


def ssh_argv(paths: StatePaths, address: str) -> list[str]:
    return [
        "ssh",
        "-i",
        str(paths.client_key),
        "-o",
        f"UserKnownHostsFile={paths.known_hosts}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=5",
        "-o",
        "LogLevel=ERROR",
        f"root@{address}",
    ]


def _port_open(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def accepts_ssh(paths: StatePaths, name: str) -> bool:
    """One ssh login to a running node (host key checked), only ever through br-lab."""
    address = node_address(node_index(name))
    net.require_bridge_route(address)
    if not _port_open(address, SSH_PORT):
        return False
    with critical_section():
        proc = subprocess.run(
            [*ssh_argv(paths, address), "true"], capture_output=True, text=True, check=False, timeout=30
        )
    return proc.returncode == 0


def stopped_while_booting(paths: StatePaths, name: str) -> bool:
    """Whether the process launch() recorded has exited. Not is_running(): its command-line check can miss nspawn in
    the instant the launching shell's exec replaces its command line (/proc/PID/cmdline can read empty then) and
    fail a boot that is under way; within a boot the recorded pid cannot have been reused."""
    pid = read_pid_file(paths.node_pid_file(name))
    return pid is None or not process_alive(pid)


def wait_for_ssh(paths: StatePaths, names: list[str], timeout_s: float) -> None:
    """Wait until every node completes an ssh login (host key checked), or fail naming the first that did not."""
    addresses = {name: node_address(int(name.removeprefix("node"))) for name in names}
    for address in addresses.values():
        net.require_bridge_route(address)
    deadline = time.monotonic() + timeout_s
    pending = list(names)
    while pending:
        for name in list(pending):
            if stopped_while_booting(paths, name):
                raise LabError(f"{name} stopped while booting (console log: {paths.node_console_log(name)})")
            if _port_open(addresses[name], SSH_PORT):
                with critical_section():
                    proc = subprocess.run(
                        [*ssh_argv(paths, addresses[name]), "true"], capture_output=True, text=True, check=False
                    )
                if proc.returncode == 0:
                    pending.remove(name)
        if pending and time.monotonic() > deadline:
            name = pending[0]
            raise LabError(
                f"{name} did not accept SSH within {timeout_s:.0f} s (console log: {paths.node_console_log(name)})"
            )
        if pending:
            time.sleep(0.1)
