"""Thin wrappers over the host: commands, mounts, processes, cgroups. No lab policy lives here."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn


class LabError(Exception):
    """A failure to report as one line. exit_code 2 = bad input or host not ready, 1 = the lab failed."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# --- signals ----------------------------------------------------------------------------------------------
# SIGTERM/SIGINT become exceptions, so an interrupted `up` unwinds into its cleanup. But an exception raised
# while subprocess.Popen is starting a child abandons that child (Popen does not wait for it): an `ip link
# add` forked just before the signal would create the bridge after the cleanup ran. So starting a process
# (and recording it) is a critical section: a signal arriving inside one is raised when it ends.

_critical_depth = 0
_pending_signal: int | None = None


def _raise_for(signum: int) -> NoReturn:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


def _on_signal(signum: int, frame: object) -> None:
    global _pending_signal
    if _critical_depth:
        _pending_signal = signum
        return
    _raise_for(signum)


def install_signal_handlers() -> None:
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)


@contextmanager
def critical_section() -> Iterator[None]:
    """Defer SIGTERM/SIGINT until the block is done (see above)."""
    global _critical_depth, _pending_signal
    _critical_depth += 1
    try:
        yield
    finally:
        _critical_depth -= 1
        if _critical_depth == 0 and _pending_signal is not None:
            signum, _pending_signal = _pending_signal, None
            _raise_for(signum)


def run(argv: Sequence[str], *, check: bool = True, input_text: str | None = None) -> str:
    """Run a host command, return its stdout; a failure becomes a LabError naming the command and its stderr."""
    with critical_section():
        proc = subprocess.run(list(argv), capture_output=True, text=True, input=input_text, check=False)
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        last = detail[-1] if detail else f"exit {proc.returncode}"
        raise LabError(f"`{' '.join(argv)}` failed: {last}")
    return proc.stdout


def mounts_under(path: Path) -> list[Path]:
    """Mount points at or below path, deepest first (the order to unmount them in)."""
    root = str(path.resolve()) if path.exists() else str(path)
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        # Field 5 is the mount point, with spaces and friends octal-escaped.
        mount_point = line.split()[4].encode().decode("unicode_escape")
        if mount_point == root or mount_point.startswith(root.rstrip("/") + "/"):
            found.append(Path(mount_point))
    return sorted(set(found), key=lambda p: len(p.parts), reverse=True)


def is_mounted(path: Path) -> bool:
    return path.resolve() in mounts_under(path)


def unmount_all_under(path: Path) -> list[str]:
    """Unmount everything at or below path; returns the problems (a lazy detach is the last resort)."""
    problems = []
    for mount_point in mounts_under(path):
        proc = subprocess.run(["umount", str(mount_point)], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            lazy = subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, text=True, check=False)
            if lazy.returncode != 0:
                problems.append(f"cannot unmount {mount_point}: {proc.stderr.strip()}")
    return problems


def remove_tree(path: Path) -> None:
    """rm -rf that refuses to descend into a mount (a stray bind mount must never be emptied through us)."""
    if not path.exists() and not path.is_symlink():
        return
    left = mounts_under(path)
    if left:
        raise LabError(f"refusing to delete {path}: still mounted: {', '.join(map(str, left))}")
    if path.is_symlink() or path.is_file():
        path.unlink()
    else:
        shutil.rmtree(path)


# --- processes --------------------------------------------------------------------------------------------


def process_alive(pid: int) -> bool:
    """True while pid exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state letter follows the parenthesised command name, which may itself contain spaces.
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def process_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def read_pid_file(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def pid_file_process(path: Path, marker: str) -> int | None:
    """The live pid recorded in path, if its command line still contains marker (guards against reuse)."""
    pid = read_pid_file(path)
    if pid is None or not process_alive(pid):
        return None
    return pid if any(marker in arg for arg in process_cmdline(pid)) else None


def signal_pids(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def wait_until_gone(pids: Iterable[int], timeout_s: float) -> list[int]:
    """Wait for the pids to exit; returns those still alive after timeout_s."""
    pending = list(pids)
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        time.sleep(0.05)
        pending = [pid for pid in pending if process_alive(pid)]
    return [pid for pid in pending if process_alive(pid)]


def namespace_pid(pid: int) -> list[int]:
    """The NSpid line: the pid as seen from each nested pid namespace, outermost first."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    except OSError:
        pass
    return []


# --- cgroups ----------------------------------------------------------------------------------------------


def cgroup_dirs(name: str, roots: Sequence[Path]) -> list[Path]:
    return [root / name for root in roots]


def cgroup_pids(cgroup: Path) -> list[int]:
    """Every pid in cgroup and its descendants."""
    pids: list[int] = []
    if not cgroup.is_dir():
        return pids
    for procs in cgroup.rglob("cgroup.procs"):
        try:
            pids += [int(x) for x in procs.read_text().split()]
        except OSError:
            continue
    return sorted(set(pids))


def remove_cgroup_tree(cgroup: Path) -> list[str]:
    """rmdir a cgroup and its children, deepest first (cgroupfs only allows rmdir of empty groups)."""
    problems = []
    if not cgroup.is_dir():
        return problems
    children = sorted((p for p in cgroup.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
    for directory in [*children, cgroup]:
        for attempt in range(20):
            try:
                directory.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as error:
                # A group empties a moment after its last process is reaped.
                if attempt == 19:
                    problems.append(f"cannot remove cgroup {directory}: {error.strerror}")
                time.sleep(0.05)
    return problems
