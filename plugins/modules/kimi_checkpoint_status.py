#!/usr/bin/python
"""Ansible module: the checkpoint on a node - marker, what is missing and free, the download job, verification."""

from __future__ import annotations

DOCUMENTATION = r"""
module: kimi_checkpoint_status
short_description: Checkpoint state on a node (marker, plan and free space, download job, progress, verify)
description:
  - C(marker) reads the marker and says whether it records this repository, commit and patterns; it does not
    list the checkpoint directory. It stats every file the marker records (size, mtime_ns, inode) and names
    those that changed since their verification (C(stale)), so a finished checkpoint costs one small read and
    a stat per file. With I(sample_files) it also hashes that many recorded files, chosen by I(sample_index),
    against the Hub checksum the marker records (drift's rotating sample).
  - C(plan) compares the listed files with what is on disk, reports missing bytes and the free space of the
    filesystem that holds the directory, and with I(repair) deletes files at a wrong size and those a failed
    verification recorded as bad.
  - C(start) starts the download script detached from Ansible (a transient systemd unit, or a new session with
    nohup semantics) unless the job recorded in the pid file is still running, in which case it attaches.
  - C(progress) reports bytes on disk (finished files plus hf's partial files) and the job's state; with
    I(wait) it first blocks on the node up to that many seconds, answering as soon as the job ends.
  - C(stop) stops the job (its process group, the script and hf; SIGTERM, then SIGKILL) and says why in a
    message naming the host, the bytes on disk and the seconds without progress; C(wait) uses it when the
    download stalled.
  - C(verify) checks every listed file's size, and its sha256 or git blob id where the Hub gave one (with
    I(only), the content of those files alone); bad files are recorded so the next C(plan) with I(repair)
    deletes them. It returns each file's marker entry (Hub checksum and stat) for the role to write.
options:
  mode:
    description: >-
      What to do. C(wait) is handled by the role's action plugin of the same name: it polls C(progress) every
      I(interval) seconds, printing a line per poll, until the job ends or I(timeout) seconds passed, and
      stops the job (C(stop)) when the bytes on disk did not grow for I(stall_timeout) seconds.
    type: str
    required: true
    choices: [marker, plan, start, progress, wait, stop, verify]
  host: {description: Host name the progress line starts with., type: str, default: ""}
  previous_time: {description: Time of an earlier progress sample (for the rate)., type: float}
  previous_bytes: {description: Bytes on disk at that sample., type: int}
  interval: {description: Seconds between polls (wait)., type: float, default: 30}
  wait:
    description: >-
      progress - seconds to block on the node before answering, returning at once when the job ends (the
      plugin's polls, so the end of the download is seen when it happens, not at the next poll).
    type: float
    default: 0
  stall_timeout:
    description: wait - stop the job when the bytes on disk did not grow for this many seconds; 0 = never.
    type: float
    default: 0
  stalled_seconds: {description: stop - seconds the download went without new bytes (for the message)., type: float}
  timeout:
    description: Seconds wait polls before it returns with the job still running; 0 = no limit.
    type: float
    default: 0
  dir: {description: The checkpoint directory., type: path, required: true}
  marker: {description: Marker file name inside dir., type: str, default: .kimi-checkpoint.json}
  state_dir: {description: Node-local directory of the job's pid, rc, log and bad-file list., type: path}
  repo_id: {type: str}
  revision: {type: str}
  include: {type: list, elements: str, default: []}
  exclude: {type: list, elements: str, default: []}
  files: {description: Files as kimi_hf_repo_files returns them., type: list, elements: dict, default: []}
  repair: {type: bool, default: false}
  margin_bytes: {description: Free space kept on top of the missing bytes (plan)., type: int, default: 0}
  checksums: {type: bool, default: true}
  only:
    description: verify - check the content of these paths only (sizes are checked for all); null = all.
    type: list
    elements: str
  sample_files:
    description: marker - recorded files to hash against the marker's checksums; 0 = none.
    type: int
    default: 0
  sample_index:
    description: marker - which window of I(sample_files) files (in name order, wrapping) to hash.
    type: int
    default: 0
  script: {description: The download script C(start) runs., type: path}
  launcher: {type: str, default: auto, choices: [auto, systemd, nohup]}
  unit: {description: Transient systemd unit name., type: str, default: kimi-checkpoint-download}
author: Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
attributes:
  check_mode:
    support: full
    details: >-
      In check mode nothing is started, stopped or deleted and no state file is written; the answer says
      what would have been done.
  diff_mode:
    support: none
    details: Its changes are a job started or stopped and files deleted; the answer names them.
"""

EXAMPLES = r"""
- name: Is the checkpoint already there
  kimi_checkpoint_status:
    mode: marker
    dir: /data/models/kimi-k2.7-code
    repo_id: moonshotai/Kimi-K2.7-Code
    revision: 0123456789abcdef0123456789abcdef01234567
"""

RETURN = r"""
matches: {description: The marker records this repo, commit and patterns (marker mode)., type: bool}
old_version: {description: The marker is of an earlier version, without file stats (marker)., type: bool}
files_recorded: {description: Number of files with a stat in the marker (marker)., type: int}
stale:
  description: One line per recorded file missing or changed (size, mtime_ns, inode) since verification (marker).
  type: list
stale_paths: {description: Their paths (marker)., type: list}
sampled: {description: The files hashed for the sample (marker)., type: list}
sample_problems: {description: One line per sampled file not matching its recorded checksum (marker)., type: list}
files:
  description: verify - path to its marker entry (sha256, git_oid, size, mtime_ns, ino) for every file on disk.
  type: dict
bad: {description: The paths of the bad files (verify)., type: list}
hashed: {description: How many files had their content checked (verify)., type: int}
marker_version: {description: The marker version to write with these entries (verify)., type: int}
missing: {description: Files still to download (plan)., type: list}
missing_bytes: {description: Their listed bytes (plan)., type: int}
free_bytes: {description: Free bytes where the directory lives (plan)., type: int}
running: {description: The download job is alive (plan, start, progress)., type: bool}
attached: {description: start found the job running and did not start another., type: bool}
bytes_on_disk: {description: Finished plus partial bytes (progress)., type: int}
exit_status: {description: The job's exit status once it ended (progress); null while running or unknown., type: int}
log_error: {description: The log's last error line once the job ended (progress); null if none., type: str}
stalled: {description: wait stopped the job because the bytes on disk stopped growing., type: bool}
stall_message:
  description: Why the job was stopped - host, seconds without new bytes, bytes on disk (stop, wait).
  type: str
problems: {description: One line per bad file (verify)., type: list}
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule

try:  # installed as the kimi.k2 collection
    from ansible_collections.kimi.k2.plugins.module_utils.kimi_checkpoint import (
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
except ImportError:  # run from the repository (ansible.cfg: module_utils = plugins/module_utils)
    from ansible.module_utils.kimi_checkpoint import (
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
# How often a blocking progress call looks whether the job is still alive: two small reads, so the end of a
# download is seen within this, at no cost worth counting.
END_CHECK_SECONDS = 0.2
# Seconds the job gets to exit on SIGTERM before its process group is killed.
STOP_GRACE_SECONDS = 10.0


def repo_files(params: dict) -> list[RepoFile]:
    fields = ("path", "size", "sha256", "git_oid")
    return [RepoFile(**{k: item.get(k) for k in fields}) for item in params["files"]]


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


def job_pid(state_dir: Path, script: str | None) -> int | None:
    """The pid of the download job when it is alive and really is our script (pid files outlive pids)."""
    try:
        pid = int((state_dir / PID_FILE).read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, ValueError):
        return None
    name = Path(script).name if script else "kimi-checkpoint-download"
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


def start(module: AnsibleModule, state_dir: Path) -> dict:
    script = module.params["script"]
    pid = job_pid(state_dir, script)
    if pid is not None:
        return {"changed": False, "attached": True, "running": True, "pid": pid}
    if module.check_mode:
        return {"changed": True, "attached": False, "running": False}
    (state_dir / RC_FILE).unlink(missing_ok=True)
    (state_dir / PID_FILE).unlink(missing_ok=True)
    if use_systemd(module.params["launcher"]):
        unit = module.params["unit"]
        # A failed unit of the same name from an earlier run would block the name: clear it first.
        subprocess.run(["systemctl", "reset-failed", f"{unit}.service"], capture_output=True, check=False)
        result = subprocess.run(
            ["systemd-run", f"--unit={unit}", "--collect", "--quiet", "--property=KillMode=control-group", script],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            module.fail_json(msg=f"systemd-run failed: {result.stderr.strip()}")
    else:
        # Its own session, no terminal and no pipe back to Ansible: it outlives the SSH connection.
        subprocess.Popen(
            [script], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True,
        )  # fmt: skip
    for _ in range(50):  # the script writes its pid first thing
        pid = job_pid(state_dir, script)
        if pid is not None or read_rc(state_dir) is not None:
            break
        time.sleep(0.1)
    return {"changed": True, "attached": False, "running": pid is not None, "pid": pid}


def run_plan(module: AnsibleModule, directory: Path, state_dir: Path | None) -> dict:
    files = repo_files(module.params)
    removed = []
    before = plan(files, sizes_on_disk(directory, files))
    if module.params["repair"]:
        recorded = []
        if state_dir is not None and (state_dir / BAD_FILE).is_file():
            recorded = json.loads((state_dir / BAD_FILE).read_text() or "[]")
        for name in sorted(set(recorded) | set(before.wrong_size)):
            path = directory / name
            if path.is_file():
                removed.append(name)
                if not module.check_mode:
                    path.unlink()
        if state_dir is not None and not module.check_mode:
            (state_dir / BAD_FILE).unlink(missing_ok=True)
    current = plan(files, sizes_on_disk(directory, files)) if removed and not module.check_mode else before
    usage = shutil.disk_usage(existing_ancestor(str(directory)))
    missing_bytes = current.missing_bytes + sum(
        f.size for f in files if f.path in removed and f.path not in current.missing
    )
    where = existing_ancestor(str(directory))
    shortfall = None
    if missing_bytes:
        host = module.params["host"] or "node"
        shortfall = disk_shortfall(host, where, missing_bytes, module.params["margin_bytes"], usage.free)
    return {
        "shortfall": shortfall,
        "changed": bool(removed),
        "removed": removed,
        "total_bytes": current.total_bytes,
        "present_bytes": current.present_bytes,
        "missing": sorted(set(current.missing) | set(removed)),
        "missing_bytes": missing_bytes,
        "free_bytes": usage.free,
        "filesystem_path": where,
        "running": job_pid(state_dir, module.params["script"]) is not None if state_dir else False,
    }


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


def stop_job(pid: int, state_dir: Path, script: str | None) -> None:
    """SIGTERM, then SIGKILL after STOP_GRACE_SECONDS to whatever of the job is still there."""
    signal_job(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    while (job_pid(state_dir, script) is not None or group_alive(pid)) and time.monotonic() < deadline:
        time.sleep(END_CHECK_SECONDS)
    if job_pid(state_dir, script) is not None or group_alive(pid):
        signal_job(pid, signal.SIGKILL)


def stop(module: AnsibleModule, directory: Path, state_dir: Path) -> dict:
    """Stop a stalled job; the message records the bytes on disk as they were when it was stopped."""
    params = module.params
    seen = progress({**params, "wait": 0}, directory, state_dir)
    pid = job_pid(state_dir, params["script"])
    message = stall_message(
        params["host"] or "node",
        params["stalled_seconds"] or 0.0,
        seen["bytes_on_disk"],
        seen["total_bytes"],
        params["stall_timeout"],
        pid,
    )
    if pid is not None and not module.check_mode:
        stop_job(pid, state_dir, params["script"])
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


def progress(params: dict, directory: Path, state_dir: Path) -> dict:
    if params["wait"]:
        wait_for_end(state_dir, params["script"], params["wait"])
    files = repo_files(params)
    total = sum(f.size for f in files)
    # Finished files count at their listed size at most, so a file being replaced never counts twice.
    finished = sum(min(size, f.size) for f in files if (size := sizes_on_disk(directory, [f]).get(f.path)))
    done = min(finished + partial_bytes(directory), total)
    now = time.time()
    previous = None
    if params["previous_time"] is not None and params["previous_bytes"] is not None:
        previous = (params["previous_time"], params["previous_bytes"])
    running = job_pid(state_dir, params["script"]) is not None
    # hf ends a failure with a traceback: its last line says what happened, the lines above mostly where.
    tail = [] if running else log_tail(state_dir, 60)
    return {
        "changed": False,
        "running": running,
        "exit_status": None if running else read_rc(state_dir),
        "bytes_on_disk": done,
        "total_bytes": total,
        "time": now,
        "line": progress_line(params["host"] or "node", done, total, rate(previous, (now, done))),
        "log_tail": tail[-15:],
        "log_error": error_line(tail),
    }


def read_marker_state(params: dict, directory: Path) -> dict:
    """The marker, whether it matches the pin, and the recorded files whose stat or (sampled) content changed."""
    try:
        marker = read_marker((directory / params["marker"]).read_text())
    except OSError:
        marker = None
    matches = marker_matches(marker, params["repo_id"], params["revision"], params["include"], params["exclude"])
    recorded = (marker or {}).get("files")
    recorded = recorded if isinstance(recorded, dict) else {}
    stale = stat_differences(recorded, {name: file_stat(directory / name) for name in recorded})
    stale_paths = bad_paths(stale)
    sampled, sample_problems = sample_check(
        directory, recorded, params["sample_files"], params["sample_index"], set(stale_paths)
    )
    return {
        "changed": False,
        "marker": marker,
        "matches": matches,
        "old_version": is_old_marker(marker),
        "files_recorded": len(recorded),
        "stale": stale,
        "stale_paths": stale_paths,
        "sampled": sampled,
        "sample_problems": sample_problems,
    }


def run_verify(module: AnsibleModule, directory: Path, state_dir: Path | None) -> dict:
    """Verify, record the bad files for the repair, and hand back every file's marker entry (its stat now)."""
    params = module.params
    files = repo_files(params)
    problems = verify(directory, files, params["checksums"], params["only"])
    if problems and state_dir is not None and not module.check_mode:
        state_dir.mkdir(parents=True, exist_ok=True)
        (state_dir / BAD_FILE).write_text(json.dumps(bad_paths(problems)))
    # Stats after the hashing: what the marker written from this answer must find on the next run.
    entries = marker_files(files, {f.path: file_stat(directory / f.path) for f in files})
    return {
        "changed": False,
        "problems": problems,
        "ok": not problems,
        "bad": bad_paths(problems),
        # How many files had their content checked (all, or those of `only`): sizes are checked for every one.
        "hashed": sum(1 for f in files if params["checksums"] and (params["only"] is None or f.path in params["only"])),
        "files": entries,
        "marker_version": MARKER_VERSION,
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "mode": {
                "type": "str",
                "required": True,
                "choices": ["marker", "plan", "start", "progress", "wait", "stop", "verify"],
            },
            "host": {"type": "str", "default": ""},
            "previous_time": {"type": "float"},
            "previous_bytes": {"type": "int"},
            "interval": {"type": "float", "default": 30},
            "wait": {"type": "float", "default": 0},
            "stall_timeout": {"type": "float", "default": 0},
            "stalled_seconds": {"type": "float"},
            "timeout": {"type": "float", "default": 0},
            "dir": {"type": "path", "required": True},
            "marker": {"type": "str", "default": ".kimi-checkpoint.json"},
            "state_dir": {"type": "path"},
            "repo_id": {"type": "str"},
            "revision": {"type": "str"},
            "include": {"type": "list", "elements": "str", "default": []},
            "exclude": {"type": "list", "elements": "str", "default": []},
            "files": {"type": "list", "elements": "dict", "default": []},
            "repair": {"type": "bool", "default": False},
            "margin_bytes": {"type": "int", "default": 0},
            "checksums": {"type": "bool", "default": True},
            "only": {"type": "list", "elements": "str"},
            "sample_files": {"type": "int", "default": 0},
            "sample_index": {"type": "int", "default": 0},
            "script": {"type": "path"},
            "launcher": {"type": "str", "default": "auto", "choices": ["auto", "systemd", "nohup"]},
            "unit": {"type": "str", "default": "kimi-checkpoint-download"},
        },
        supports_check_mode=True,
    )
    params = module.params
    directory = Path(params["dir"])
    state_dir = Path(params["state_dir"]) if params["state_dir"] else None
    mode = params["mode"]
    if mode == "marker":
        module.exit_json(**read_marker_state(params, directory))
    if mode in ("start", "progress", "wait", "stop") and state_dir is None:
        module.fail_json(msg=f"mode {mode} needs state_dir")
    if mode == "plan":
        module.exit_json(**run_plan(module, directory, state_dir))
    if mode == "start":
        module.exit_json(**start(module, state_dir))
    if mode in ("progress", "wait"):
        module.exit_json(**progress(params, directory, state_dir))
    if mode == "stop":
        module.exit_json(**stop(module, directory, state_dir))
    module.exit_json(**run_verify(module, directory, state_dir))


if __name__ == "__main__":
    main()
