"""The checkpoint on one node: its files and marker read from disk, the detached download job started, watched
and stopped, and the verification run. The kimi_checkpoint_* modules are thin wrappers over these functions.

The rules (what is missing, what a marker must record, how a file is verified) are in kimi_checkpoint.py; this
file is where they meet the node's filesystem and processes. Every function that changes something takes
`check_mode` and then only says what it would do.

The job is the download script run detached from Ansible, either as a transient systemd unit or in a new
session (nohup semantics), so an SSH drop stops only the watching. Its state lives in `state_dir`: the script
writes its pid first and its exit status last, and hf's output goes to the log.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .kimi_checkpoint import (
    MARKER_VERSION,
    RepoFile,
    bad_paths,
    disk_shortfall,
    error_line,
    existing_ancestor,
    file_stat,
    is_old_marker,
    marker_files,
    marker_matches,
    plan,
    progress_line,
    rate,
    read_marker,
    sample_check,
    stall_message,
    stat_differences,
    verify,
)

PID_FILE, RC_FILE, LOG_FILE, BAD_FILE = "download.pid", "download.rc", "download.log", "bad-files.json"
HF_PARTIAL_DIR = Path(".cache") / "huggingface" / "download"
DEFAULT_SCRIPT_NAME = "kimi-checkpoint-download"
# How often a blocking progress call looks whether the job is still alive: two small reads, so the end of a
# download is seen within this, at no cost worth counting.
END_CHECK_SECONDS = 0.2
# Seconds the job gets to exit on SIGTERM before its process group is killed.
STOP_GRACE_SECONDS = 10.0
# The script writes its pid first thing: how long start waits to see it (50 x 0.1 s).
START_CHECKS, START_CHECK_SECONDS = 50, 0.1

Runner = Callable[..., subprocess.CompletedProcess]


class JobError(RuntimeError):
    """The job could not be started; the message says what the launcher answered."""


# ---------------------------------------------------------------- the files on disk


def repo_files(items: list[dict]) -> list[RepoFile]:
    """The file list as kimi_hf_repo_files returns it, as RepoFile records."""
    fields = ("path", "size", "sha256", "git_oid")
    return [RepoFile(**{k: item.get(k) for k in fields}) for item in items]


def sizes_on_disk(directory: Path, files: list[RepoFile]) -> dict[str, int]:
    sizes = {}
    for repo_file in files:
        path = directory / repo_file.path
        if path.is_file():
            sizes[repo_file.path] = path.stat().st_size
    return sizes


def partial_bytes(directory: Path) -> int:
    """Bytes of hf's in-flight files (`<local-dir>/.cache/huggingface/download/**.incomplete`)."""
    root = directory / HF_PARTIAL_DIR
    if not root.is_dir():
        return 0
    return sum(p.stat().st_size for p in root.rglob("*.incomplete") if p.is_file())


def marker_state(
    directory: Path,
    marker_name: str,
    pin: dict[str, Any],
    sample_count: int = 0,
    sample_index: int = 0,
) -> dict[str, Any]:
    """The marker, whether it records the pin (repo_id, revision, include, exclude), and the recorded files
    whose stat changed since verification or whose sampled content differs from the recorded checksum."""
    try:
        marker = read_marker((directory / marker_name).read_text())
    except OSError:
        marker = None
    matches = marker_matches(
        marker, pin.get("repo_id"), pin.get("revision"), pin.get("include") or [], pin.get("exclude") or []
    )
    recorded = (marker or {}).get("files")
    recorded = recorded if isinstance(recorded, dict) else {}
    stale = stat_differences(recorded, {name: file_stat(directory / name) for name in recorded})
    stale_paths = bad_paths(stale)
    sampled, sample_problems = sample_check(directory, recorded, sample_count, sample_index, set(stale_paths))
    return {
        "marker": marker,
        "matches": matches,
        "old_version": is_old_marker(marker),
        "files_recorded": len(recorded),
        "stale": stale,
        "stale_paths": stale_paths,
        "sampled": sampled,
        "sample_problems": sample_problems,
    }


def recorded_bad(state_dir: Path | None) -> list[str]:
    """The files the last failed verification recorded as bad."""
    if state_dir is None or not (state_dir / BAD_FILE).is_file():
        return []
    return json.loads((state_dir / BAD_FILE).read_text() or "[]")


def download_plan(
    directory: Path,
    files: list[RepoFile],
    host: str,
    margin_bytes: int,
    state_dir: Path | None = None,
    repair: bool = False,
    check_mode: bool = False,
    script: str | None = None,
) -> dict[str, Any]:
    """What the download must fetch and whether the disk can take it.

    With `repair`, files at a wrong size and those a failed verification recorded are deleted first (in check
    mode they are only counted as missing), and the record of bad files is cleared.
    """
    removed = []
    before = plan(files, sizes_on_disk(directory, files))
    if repair:
        for name in sorted(set(recorded_bad(state_dir)) | set(before.wrong_size)):
            path = directory / name
            if path.is_file():
                removed.append(name)
                if not check_mode:
                    path.unlink()
        if state_dir is not None and not check_mode:
            (state_dir / BAD_FILE).unlink(missing_ok=True)
    current = plan(files, sizes_on_disk(directory, files)) if removed and not check_mode else before
    where = existing_ancestor(str(directory))
    free = shutil.disk_usage(where).free
    missing_bytes = current.missing_bytes + sum(
        f.size for f in files if f.path in removed and f.path not in current.missing
    )
    shortfall = disk_shortfall(host, where, missing_bytes, margin_bytes, free) if missing_bytes else None
    return {
        "changed": bool(removed),
        "removed": removed,
        "shortfall": shortfall,
        "total_bytes": current.total_bytes,
        "present_bytes": current.present_bytes,
        "missing": sorted(set(current.missing) | set(removed)),
        "missing_bytes": missing_bytes,
        "free_bytes": free,
        "filesystem_path": where,
        "running": job_pid(state_dir, script) is not None if state_dir else False,
    }


def read_arrival_record(path: Path | None) -> dict[str, dict] | None:
    """The fetch program's fetch-checked.json (files it checked against their checksum as it took them from a peer,
    with their stat once in place); None when there is none or it does not parse (then every file is hashed)."""
    if path is None:
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def checked_on_arrival(directory: Path, files: list[RepoFile], record: dict[str, dict] | None) -> set[str]:
    """The listed files whose content the fetch program checked on arrival and whose stat (size, mtime, inode) has
    not changed since: hashing them again would read the same bytes a second time."""
    if not record:
        return set()
    listed = {f.path for f in files}
    recorded = {name: entry for name, entry in record.items() if name in listed and isinstance(entry, dict)}
    seen = {name: file_stat(directory / name) for name in recorded}
    changed = set(bad_paths(stat_differences(recorded, seen)))
    return set(recorded) - changed


def run_verification(
    directory: Path,
    files: list[RepoFile],
    checksums: bool,
    only: list[str] | None,
    state_dir: Path | None = None,
    check_mode: bool = False,
    arrival: dict[str, dict] | None = None,
) -> dict[str, Any]:
    """Verify, record the bad files for the next repair, and return every file's marker entry (its stat now).

    `arrival`: read_arrival_record's; the content of a file checked on arrival, with its stat unchanged, is not
    hashed again (its size still is checked)."""
    trusted = checked_on_arrival(directory, files, arrival) if checksums else set()
    if trusted:
        scope = [f.path for f in files] if only is None else list(only)
        # Counted among the files this run would have hashed: the others were not going to be read anyway.
        trusted &= set(scope)
        only = [name for name in scope if name not in trusted]
    problems = verify(directory, files, checksums, only)
    if problems and state_dir is not None and not check_mode:
        state_dir.mkdir(parents=True, exist_ok=True)
        (state_dir / BAD_FILE).write_text(json.dumps(bad_paths(problems)))
    # Stats after the hashing: what the marker written from this answer must find on the next run.
    entries = marker_files(files, {f.path: file_stat(directory / f.path) for f in files})
    return {
        "problems": problems,
        "ok": not problems,
        "bad": bad_paths(problems),
        # How many files had their content checked (all, or those of `only`): sizes are checked for every one.
        "hashed": sum(1 for f in files if checksums and (only is None or f.path in only)),
        # How many the fetch program had checked as it took them from a peer (not hashed again).
        "checked_on_arrival": len(trusted),
        "files": entries,
        "marker_version": MARKER_VERSION,
    }


# ---------------------------------------------------------------- the download job


def job_pid(state_dir: Path, script: str | None) -> int | None:
    """The pid of the download job when it is alive and really is our script (pid files outlive pids)."""
    try:
        pid = int((state_dir / PID_FILE).read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, ValueError):
        return None
    name = Path(script).name if script else DEFAULT_SCRIPT_NAME
    return pid if name in cmdline else None


def read_rc(state_dir: Path) -> int | None:
    try:
        return int((state_dir / RC_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def log_tail(state_dir: Path, lines: int = 15) -> list[str]:
    try:
        return (state_dir / LOG_FILE).read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def use_systemd(launcher: str) -> bool:
    if launcher == "auto":
        return Path("/run/systemd/system").is_dir() and shutil.which("systemd-run") is not None
    return launcher == "systemd"


def start_job(
    state_dir: Path,
    script: str,
    launcher: str = "auto",
    unit: str = DEFAULT_SCRIPT_NAME,
    check_mode: bool = False,
    run: Runner = subprocess.run,
) -> dict[str, Any]:
    """Start the script detached, or attach to the job already running; raises JobError if systemd-run fails."""
    pid = job_pid(state_dir, script)
    if pid is not None:
        return {"changed": False, "attached": True, "running": True, "pid": pid}
    if check_mode:
        return {"changed": True, "attached": False, "running": False, "pid": None}
    (state_dir / RC_FILE).unlink(missing_ok=True)
    (state_dir / PID_FILE).unlink(missing_ok=True)
    if use_systemd(launcher):
        # A failed unit of the same name from an earlier run would block the name: clear it first.
        run(["systemctl", "reset-failed", f"{unit}.service"], capture_output=True, check=False)
        argv = ["systemd-run", f"--unit={unit}", "--collect", "--quiet", "--property=KillMode=control-group", script]
        result = run(argv, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise JobError(f"systemd-run failed: {result.stderr.strip()}")
    else:
        # Its own session, no terminal and no pipe back to Ansible: it outlives the SSH connection.
        subprocess.Popen(
            [script], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True,
        )  # fmt: skip
    for _ in range(START_CHECKS):
        pid = job_pid(state_dir, script)
        if pid is not None or read_rc(state_dir) is not None:
            break
        time.sleep(START_CHECK_SECONDS)
    return {"changed": True, "attached": False, "running": pid is not None, "pid": pid}


def wait_for_end(state_dir: Path, script: str | None, seconds: float) -> None:
    """Block up to `seconds`, returning as soon as the job is no longer alive."""
    deadline = time.monotonic() + seconds
    while job_pid(state_dir, script) is not None and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(END_CHECK_SECONDS, left))


def signal_job(pid: int, sig: int) -> None:
    """`sig` to the job: its whole process group when it leads one (both launchers start it as a session
    leader, so hf is in it), else the script and its direct children."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
            return
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except (OSError, ValueError):
        children = []
    for target in [pid, *(int(child) for child in children)]:
        with contextlib.suppress(OSError):
            os.kill(target, sig)


def group_alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except OSError:
        return False
    return True


def stop_job(pid: int, state_dir: Path, script: str | None, grace: float = STOP_GRACE_SECONDS) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds to whatever of the job is still there."""
    signal_job(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while (job_pid(state_dir, script) is not None or group_alive(pid)) and time.monotonic() < deadline:
        time.sleep(END_CHECK_SECONDS)
    if job_pid(state_dir, script) is not None or group_alive(pid):
        signal_job(pid, signal.SIGKILL)


def progress(
    directory: Path,
    state_dir: Path,
    files: list[RepoFile],
    script: str | None,
    host: str,
    wait: float = 0,
    previous: tuple[float, int] | None = None,
) -> dict[str, Any]:
    """Bytes on disk (finished files plus hf's partial ones) and the job's state; with `wait`, first block
    up to that many seconds, answering as soon as the job ends."""
    if wait:
        wait_for_end(state_dir, script, wait)
    total = sum(f.size for f in files)
    # Finished files count at their listed size at most, so a file being replaced never counts twice.
    finished = sum(min(size, f.size) for f in files if (size := sizes_on_disk(directory, [f]).get(f.path)))
    done = min(finished + partial_bytes(directory), total)
    now = time.time()
    running = job_pid(state_dir, script) is not None
    # hf ends a failure with a traceback: its last line says what happened, the lines above mostly where.
    tail = [] if running else log_tail(state_dir, 60)
    return {
        "running": running,
        "exit_status": None if running else read_rc(state_dir),
        "bytes_on_disk": done,
        "total_bytes": total,
        "time": now,
        "line": progress_line(host, done, total, rate(previous, (now, done))),
        "log_tail": tail[-15:],
        "log_error": error_line(tail),
    }


def stop_stalled(
    directory: Path,
    state_dir: Path,
    files: list[RepoFile],
    script: str | None,
    host: str,
    stalled_seconds: float,
    stall_timeout: float,
    check_mode: bool = False,
) -> dict[str, Any]:
    """Stop the job; the message (also appended to its log) records the bytes on disk when it was stopped."""
    seen = progress(directory, state_dir, files, script, host)
    pid = job_pid(state_dir, script)
    message = stall_message(host, stalled_seconds, seen["bytes_on_disk"], seen["total_bytes"], stall_timeout, pid)
    if pid is not None and not check_mode:
        stop_job(pid, state_dir, script)
        with (state_dir / LOG_FILE).open("a") as log:
            log.write(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} stopped by the role: {message}\n")
    return {
        "changed": pid is not None,
        "stopped": pid is not None,
        "pid": pid,
        "bytes_on_disk": seen["bytes_on_disk"],
        "total_bytes": seen["total_bytes"],
        "stall_message": message,
    }
