"""What `kimi_files` decides before it touches a node: which directories and files differ from what a role wants,
how a file's validate command is built, and the diff Ansible shows for it.

Why a module of its own: `ansible.builtin.template` and `copy` each pay two module runs on a node per file even when
nothing changes (a stat, then `file` for the attributes), and a converge that changes nothing wrote about forty
files that way: about 40 % of its Ansible time on the two-node lab (`make bench-converge`). Ansible has no task
that writes several files in one module run, so a role's files go through one call here; the content is still
rendered on the controller by Ansible's own `template` and `file` lookups.
"""

from __future__ import annotations

import shlex
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Larger files are compared and written, but shown in a diff only as a size (Ansible's own limit is 100 kB).
DIFF_MAX_BYTES = 104448


@dataclass(frozen=True)
class WantedFile:
    """One file a role wants on the node: its bytes and how it is checked before it replaces the old one."""

    dest: str
    content: bytes
    validate: str | None = None


def validate_argv(validate: str, candidate: str, dest: str) -> list[str]:
    """The validate command for a candidate file: `%s` is the candidate's path, as in `ansible.builtin.template`.
    A command without `%s` would check the old file (or nothing), so it is refused, naming the file."""
    if "%s" not in validate:
        raise ValueError(f"validate for {dest} must contain %s (the candidate file's path): {validate!r}")
    return [part.replace("%s", candidate) for part in shlex.split(validate)]


def content_differs(current: bytes | None, wanted: bytes) -> bool:
    """A missing file differs; an existing one only when its bytes do."""
    return current is None or current != wanted


def content_diff(dest: str, current: bytes | None, wanted: bytes) -> dict[str, str]:
    """The before/after pair `--diff` prints for one file; binary or large content is named by its size."""

    def shown(data: bytes | None) -> str:
        if data is None:
            return ""
        if len(data) > DIFF_MAX_BYTES or b"\0" in data:
            return f"({len(data)} bytes, not shown)\n"
        return data.decode("utf-8", errors="replace")

    # No before_header for a file that is not there, as ansible.builtin.template does (drift reads it as missing).
    headers = {"before_header": dest} if current is not None else {}
    return {**headers, "after_header": dest, "before": shown(current), "after": shown(wanted)}


def distinct_directories(directories: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The same directory given twice with the same owner, group and mode is one directory (a role names the
    directories of two files that may be configured into one)."""
    distinct: list[Mapping[str, Any]] = []
    for entry in directories:
        if entry not in distinct:
            distinct.append(entry)
    return distinct


def duplicate_paths(directories: Sequence[Mapping[str, Any]], files: Sequence[Mapping[str, Any]]) -> list[str]:
    """Paths named twice in one call (a directory twice with other attributes, or a file twice): which entry wins
    would depend on the order, so the call is refused."""
    seen: set[str] = set()
    repeated: list[str] = []
    for path in [entry["path"] for entry in distinct_directories(directories)] + [entry["dest"] for entry in files]:
        normalised = path.rstrip("/") or "/"
        if normalised in seen and normalised not in repeated:
            repeated.append(normalised)
        seen.add(normalised)
    return repeated


def wanted_file(entry: Mapping[str, Any]) -> WantedFile:
    content = entry["content"]
    data = content.encode("utf-8") if isinstance(content, str) else bytes(content)
    return WantedFile(dest=entry["dest"], content=data, validate=entry.get("validate"))


# What follows runs on the node, inside a module (AnsibleModule's attribute setters and atomic_move do the rest).


def read_current(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def attributes(module: Any, entry: Mapping[str, Any], path: str, diffs: list[dict[str, Any]]) -> bool:
    """Owner, group and mode where they differ (check mode: only says so); their diff when they did."""
    diff: dict[str, Any] = {"before": {"path": path}, "after": {"path": path}}
    file_args = module.load_file_common_arguments({**entry, "path": path}, path=path)
    changed = module.set_fs_attributes_if_different(file_args, False, diff=diff)
    if changed and module._diff:
        diffs.append(diff)
    return changed


def ensure_directory(module: Any, entry: Mapping[str, Any], diffs: list[dict[str, Any]]) -> bool:
    """The directory (and its parents) made when missing, then its attributes; True when anything changed."""
    path = Path(entry["path"])
    created = False
    if not path.is_dir():
        if path.is_symlink() or path.exists():
            module.fail_json(msg=f"{path} exists and is not a directory", changed_paths=[])
        created = True
        if module._diff:
            diffs.append(
                {"before": {"path": str(path), "state": "absent"}, "after": {"path": str(path), "state": "directory"}}
            )
        if module.check_mode:
            return True
        path.mkdir(parents=True)
    return attributes(module, entry, str(path), diffs) or created


def write_checked(module: Any, wanted: WantedFile) -> None:
    """A temporary file beside the destination, validated, then renamed over it (atomic_move keeps the old file's
    owner and mode; the attributes are set afterwards like any other)."""
    dest = Path(wanted.dest)
    handle, name = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    candidate = Path(name)
    try:
        with open(handle, "wb") as stream:
            stream.write(wanted.content)
        if wanted.validate:
            argv = validate_argv(wanted.validate, str(candidate), wanted.dest)
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                module.fail_json(
                    msg=f"validate refused the new {wanted.dest} (kept the old one): {' '.join(argv)}",
                    rc=done.returncode,
                    stdout=done.stdout,
                    stderr=done.stderr,
                    changed_paths=[],
                )
        module.atomic_move(str(candidate), wanted.dest)
    finally:
        candidate.unlink(missing_ok=True)


def ensure_file(module: Any, entry: Mapping[str, Any], diffs: list[dict[str, Any]]) -> bool:
    """The file written when its bytes differ, then its attributes; True when anything changed (or would)."""
    try:
        wanted = wanted_file(entry)
        if wanted.validate:
            validate_argv(wanted.validate, "candidate", wanted.dest)
    except ValueError as error:
        module.fail_json(msg=str(error), changed_paths=[])
    dest = Path(wanted.dest)
    if dest.is_dir():
        module.fail_json(msg=f"{dest} is a directory, not a file", changed_paths=[])
    current = read_current(dest)
    written = content_differs(current, wanted.content)
    if written:
        if module._diff:
            diffs.append(content_diff(wanted.dest, current, wanted.content))
        if module.check_mode and current is None:
            return True
        if not module.check_mode:
            write_checked(module, wanted)
    return attributes(module, entry, wanted.dest, diffs) or written
