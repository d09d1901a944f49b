"""The node base: a Debian 12 rootfs built once with debootstrap and cached, keyed by a hash of its recipe.

Every node boots from this tree through its own overlayfs layer, so the base is never written to after it is
built. Whatever differs per node (hostname, keys, address, apt source) is written by nodes.py instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

from .system import LabError, remove_tree, run, unmount_all_under

SUITE = "bookworm"
VARIANT = "minbase"
# What a node needs to be an ordinary Ansible target: systemd as PID 1, sshd, Python with the bindings
# ansible.builtin.apt (python3-apt) and deb822_repository (python3-debian) import, acl for become to an
# unprivileged user, and the archivers unarchive calls.
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "sudo",
    "iproute2",
    "openssh-server",
    "python3",
    "python3-apt",
    "python3-debian",
    "ca-certificates",
    "iputils-ping",
    "procps",
    "acl",
    "xz-utils",
    "unzip",
    "zstd",
)
# Timers that would grab the dpkg lock in the middle of a play (and a backup job nobody needs).
MASKED_UNITS = (
    "apt-daily.timer",
    "apt-daily.service",
    "apt-daily-upgrade.timer",
    "apt-daily-upgrade.service",
    "dpkg-db-backup.timer",
    "dpkg-db-backup.service",
    "e2scrub_all.timer",
    "fstrim.timer",
)
SSHD_DROP_IN = """\
# Lab nodes: root logs in with the lab's generated key only; one host key, written per node by lab/lab.
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
"""


def recipe(debian_mirror: str) -> dict[str, object]:
    """Everything the base depends on; changing any of it (this file included) builds a new base."""
    return {
        "suite": SUITE,
        "variant": VARIANT,
        "packages": sorted(PACKAGES),
        "debian_mirror": debian_mirror,
        "code_sha256": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
    }


def recipe_key(recipe_: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(recipe_, sort_keys=True).encode()).hexdigest()[:16]


def base_dir(cache: Path, debian_mirror: str) -> Path:
    return cache / "base" / recipe_key(recipe(debian_mirror))


def rootfs_path(cache: Path, debian_mirror: str) -> Path:
    return base_dir(cache, debian_mirror) / "rootfs"


def is_built(cache: Path, debian_mirror: str) -> bool:
    return (base_dir(cache, debian_mirror) / "recipe.json").is_file()


def build(cache: Path, debian_mirror: str, log: Path | None = None) -> Path:
    """Return the cached rootfs, building it first if its recipe has no build yet."""
    final = base_dir(cache, debian_mirror)
    if is_built(cache, debian_mirror):
        return final / "rootfs"
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.parent / f".building-{final.name}-{os.getpid()}"
    started = time.monotonic()
    try:
        _debootstrap(staging / "rootfs", debian_mirror, log or final.parent / f"{final.name}.debootstrap.log")
        customise(staging / "rootfs")
        recipe_text = json.dumps(recipe(debian_mirror), indent=2, sort_keys=True)
        (staging / "recipe.json").write_text(recipe_text + "\n")
        # rename() is atomic: a base directory either has its recipe.json or does not exist.
        staging.rename(final)
    finally:
        if staging.exists():
            unmount_all_under(staging)
            remove_tree(staging)
    print(f"base: built {final} in {time.monotonic() - started:.0f} s")
    return final / "rootfs"


def prune(cache: Path, keep: set[Path]) -> list[Path]:
    """Remove cached bases (and interrupted builds) other than those in keep; returns what was removed.

    Only called while no lab is up or with the running lab's base in keep: a base is an overlay lower layer
    and must not vanish under a running node."""
    removed = []
    base_root = cache / "base"
    if not base_root.is_dir():
        return removed
    keep_resolved = {p.resolve() for p in keep}
    for entry in sorted(base_root.iterdir()):
        if entry.is_dir() and entry.resolve() not in keep_resolved:
            unmount_all_under(entry)
            remove_tree(entry)
            Path(f"{entry}.debootstrap.log").unlink(missing_ok=True)
            removed.append(entry)
    return removed


def _debootstrap(target: Path, debian_mirror: str, log: Path) -> None:
    target.mkdir(parents=True)
    argv = [
        "debootstrap",
        f"--variant={VARIANT}",
        f"--include={','.join(PACKAGES)}",
        SUITE,
        str(target),
        debian_mirror,
    ]
    print(f"base: debootstrap {SUITE} from {debian_mirror} (about 75 s; log {log})")
    with log.open("w") as out:
        proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        tail = log.read_text().strip().splitlines()[-1:] or ["no output"]
        raise LabError(f"debootstrap failed (exit {proc.returncode}): {tail[0]} (full log: {log})")


def _chroot(root: Path, *argv: str) -> None:
    run(["chroot", str(root), *argv])


def customise(root: Path) -> None:
    """Turn a fresh debootstrap tree into a node base: no per-host identity, no Debian sources, quiet timers."""
    # debootstrap copies the builder's hostname, hosts and resolv.conf; sshd's postinst made host keys that
    # every node would share. Nodes get their own identity at boot time instead.
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "etc/hostname").write_text("localhost\n")
    (root / "etc/hosts").write_text("127.0.0.1\tlocalhost\n")
    (root / "etc/machine-id").write_text("")
    resolv = root / "etc/resolv.conf"
    if resolv.is_symlink() or resolv.exists():
        resolv.unlink()
    resolv.write_text("# Lab nodes have no DNS: everything they need is addressed by IP.\n")
    (root / "etc/ssh/sshd_config.d/lab.conf").write_text(SSHD_DROP_IN)
    # minbase has no locales package; C.UTF-8 is built into glibc (and pam_env stops warning at each login).
    (root / "etc/default/locale").write_text("LANG=C.UTF-8\n")
    (root / "root/.ssh").mkdir(mode=0o700, exist_ok=True)

    _chroot(root, "systemctl", "enable", "systemd-networkd.service", "ssh.service")
    _chroot(root, "systemctl", "mask", *MASKED_UNITS)

    # Nodes cannot reach Debian's registry: the only source they get is the lab's mirror (nodes.py).
    (root / "etc/apt/sources.list").unlink(missing_ok=True)
    _chroot(root, "apt-get", "clean")
    lists = root / "var/lib/apt/lists"
    for entry in lists.iterdir():
        if entry.is_file():
            entry.unlink()
    # An old mtime on the lists directory makes apt's cache_valid_time treat the cache as stale, so the first
    # `apt: update_cache=yes cache_valid_time=...` really runs `apt-get update`.
    os.utime(lists, (0, 0))
