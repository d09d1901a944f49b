"""Drift of a converged cluster: everything that no longer equals what site.yml would make of it, as findings
per host, grouped by serving replica, one report (JSON and Markdown), a short table and one verdict.

The inputs are plain data gathered by playbooks/drift.yml: the JSON lines the kimi_drift_changes callback
wrote during a check-mode converge, kimi_parity's result, each node's checkpoint marker, the state of its
vLLM units and rank 0's /health answer. Nothing here touches a node or the network, so every rule is
unit-tested on its own (tests/unit/plugins/module_utils/test_kimi_drift.py).

A finding is drift unless an ignore pattern matches it; warnings (kernel or OS differences, tasks check mode
cannot evaluate, failures the converge itself ignores) are notes and never change the verdict.
"""

from __future__ import annotations

import base64
import difflib
import json
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from . import kimi_report
from .kimi_checkpoint import (
    MARKER_VERSION,
    is_commit_sha,
    is_old_marker,
    pin_matches,
    read_marker,
)
from .kimi_replicas import DEFAULT_REPLICA
from .kimi_serve import API_UNIT, HEADLESS_UNIT
from .kimi_systemd import parse_systemctl_show

REPORT_SCHEMA = 1
# Finding kinds, in the order the report shows them. Each is documented with an example in docs/drift.md.
KINDS = (
    "run",  # the check-mode converge itself: did not run, failed, left no record
    "unreachable",  # a node the checks could not read
    "edited",  # a unit or environment file that differs from what the playbook renders
    "converge",  # any other change the check-mode converge would make
    "converge_failed",  # a converge task that failed on a node, or a node it could not reach
    "version",  # a pinned deb or wheel at another version
    "hold",  # a pinned deb that is not held
    "parity",  # any other difference between nodes (driver, CUDA, NCCL, environment, interfaces)
    # the marker missing, unverified, old, or for another repository or revision; a file changed since its
    # verification (stat) or not its recorded checksum (rotating sample)
    "checkpoint",
    "service",  # a vLLM unit not installed, not active, or where it should not be
    "health",  # rank 0's /health not answering 200
    "incomplete",  # something drift needs could not be established (the pin set, the checkpoint settings)
)
# Actions whose changes are about a file's content or attributes.
FILE_ACTIONS = {
    "template",
    "copy",
    "file",
    "lineinfile",
    "blockinfile",
    "replace",
    "ini_file",
    "assemble",
    # The collection's own: a role's files in one module run, and a pinned deb set's preferences file.
    "kimi_files",
    "kimi_deb_pins",
}
PACKAGE_ACTIONS = {"apt", "package", "deb822_repository", "apt_repository", "apt_key", "dpkg", "debconf"}
HOLD_ACTIONS = {"dpkg_selections"}
PIP_ACTIONS = {"pip"}
SERVICE_ACTIONS = {"systemd", "systemd_service", "service", "sysvinit"}
COMMAND_ACTIONS = {"command", "shell", "raw", "script"}
# The firewall role's module: its msg names each rule changed by hand since the last apply.
FIREWALL_ACTIONS = {"kimi_nftables"}
# The files a person is tempted to edit on a node: the vLLM (and Ray) units and the environment they load.
UNIT_FILE = re.compile(r"(^|/)kimi-[A-Za-z0-9_.@-]*\.service$")
ENV_FILE = re.compile(r"(^|/)etc/kimi/[^/]+\.env$")
PIP_COMMAND = re.compile(r"(^|[\s/])(pip3?|-m pip)(\s|$)")
# Changed checkpoint files named one finding each, up to this many; the rest are counted in one more finding.
CHANGED_FILES_SHOWN = 10
# Lines of the converge's own output kept when it failed: the end is where the reason is.
TAIL_LINES = 40
TABLE_COLUMNS = (
    ("host", None),
    ("rank", None),
    ("edited", ("edited",)),
    ("converge", ("converge", "converge_failed")),
    ("versions", ("version",)),
    ("holds", ("hold",)),
    ("parity", ("parity",)),
    ("checkpoint", ("checkpoint",)),
    ("service", ("service",)),
    ("health", ("health",)),
    ("verdict", None),
)
# The table's column naming each host's replica, after `host`; only when the report has several groups.
REPLICA_COLUMN = ("replica", None)


@dataclass
class Finding:
    """One thing that drifted. host None: the cluster as a whole (the converge run itself)."""

    kind: str
    host: str | None
    title: str
    detail: str = ""
    diff: str = ""
    fix: str = ""
    category: str = ""
    source: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A title is one line of the play's failure message: a module's multi-line error must not split it.
        self.title = " ".join(self.title.split())

    def line(self) -> str:
        return f"{self.host or 'cluster'}: {self.kind}: {self.title}"


# ------------------------------------------------------------------------------------- the converge's record


def parse_changes(text: str) -> tuple[list[dict[str, Any]], int]:
    """The callback's records, and how many lines were not JSON objects (a line cut by a crash)."""
    records, bad = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(record, dict) and "kind" in record:
            records.append(record)
        else:
            bad += 1
    return records, bad


def short_action(action: str | None) -> str:
    """`ansible.builtin.template` -> `template` (FQCN or short name, as the task was written)."""
    return (action or "").rsplit(".", 1)[-1]


def record_path(record: dict[str, Any]) -> str | None:
    """The file a record is about: the callback's path, else the header of a content diff (a node path)."""
    if record.get("path"):
        return str(record["path"])
    for entry in record.get("diff") or []:
        header = entry.get("before_header")
        if isinstance(header, str) and header.startswith("/"):
            return header
    return None


def classify(record: dict[str, Any]) -> str:
    """What a converge record is about: unit_file, env_file, file, package, hold, pip, service, command, firewall,
    other."""
    action = short_action(record.get("action"))
    path = record_path(record) or ""
    if action in FILE_ACTIONS or (record.get("censored") and path):
        if UNIT_FILE.search(path):
            return "unit_file"
        if ENV_FILE.search(path):
            return "env_file"
        return "file"
    if action in HOLD_ACTIONS:
        return "hold"
    if action in PACKAGE_ACTIONS:
        return "package"
    if action in PIP_ACTIONS:
        return "pip"
    if action in SERVICE_ACTIONS:
        return "service"
    if action in COMMAND_ACTIONS:
        return "pip" if PIP_COMMAND.search(str(record.get("cmd") or "")) else "command"
    if action in FIREWALL_ACTIONS:
        return "firewall"
    return "other"


def _is_missing(record: dict[str, Any]) -> bool:
    """The file does not exist on the node (a template diff with no 'before' file, or state absent)."""
    for entry in record.get("diff") or []:
        before = entry.get("before")
        if isinstance(before, dict) and before.get("state") == "absent":
            return True
        if before == "" and "before_header" not in entry:
            return True
    return False


def render_diff(entries: list[dict[str, Any]], path: str | None = None) -> str:
    """A unified diff (node -> what the playbook would write), attribute changes as `key: old -> new`, or the
    module's own prepared text (apt's "The following packages will be upgraded")."""
    parts = []
    for entry in entries:
        before, after = entry.get("before"), entry.get("after")
        if isinstance(before, str) and isinstance(after, str):
            name = path or entry.get("before_header") or "file"
            lines = difflib.unified_diff(
                before.splitlines(keepends=True),
                after.splitlines(keepends=True),
                fromfile=f"{name} (on the node)",
                tofile=f"{name} (what the converge writes)",
            )
            text = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
            if text:
                parts.append(text.rstrip("\n"))
        elif isinstance(before, dict) or isinstance(after, dict):
            before, after = before or {}, after or {}
            for key in sorted(set(before) | set(after)):
                if key != "path" and before.get(key) != after.get(key):
                    parts.append(f"{key}: {before.get(key, '-')} -> {after.get(key, '-')}")
        if entry.get("prepared"):
            parts.append(str(entry["prepared"]).rstrip("\n"))
        if entry.get("src_binary") or entry.get("dst_binary"):
            parts.append("(binary content: no text diff)")
    return "\n".join(parts)


def _task_ref(record: dict[str, Any]) -> str:
    role = record.get("role")
    task = record.get("task") or "?"
    return f"{role} : {task}" if role else task


def _source(record: dict[str, Any]) -> dict[str, Any]:
    keys = ("play", "role", "task", "action", "item", "path", "handler", "censored")
    return {key: record[key] for key in keys if record.get(key) not in (None, "")}


def change_finding(record: dict[str, Any]) -> Finding:
    """A converge record that would change a node, as a finding: hand-edited files named as such."""
    category = classify(record)
    host = record.get("host")
    path = record_path(record)
    where = _task_ref(record)
    item = f" [{record['item']}]" if record.get("item") else ""
    diff = "" if record.get("censored") else render_diff(record.get("diff") or [], path)
    source = _source(record)
    if record["kind"] == "would_run":
        command = f": {record['cmd']}" if record.get("cmd") else ""
        label = "pip" if category == "pip" else "handler" if record.get("handler") else "command"
        return Finding(
            "converge",
            host,
            f"{label} would run: {where}{item}",
            detail=f"check mode skips commands; a real converge would run it{command}",
            category=category,
            source=source,
        )
    if category in ("unit_file", "env_file") and path:
        noun = "unit file" if category == "unit_file" else "environment file"
        if record.get("censored"):
            return Finding(
                "edited",
                host,
                f"edited by hand: {path} ({noun}; content hidden by no_log)",
                detail=f"{where} would rewrite it; its content is secret, so no diff is recorded",
                category=category,
                source=source,
            )
        if _is_missing(record):
            return Finding(
                "edited",
                host,
                f"missing: {path} ({noun})",
                detail=f"{where} would create it",
                diff=diff,
                category=category,
                source=source,
            )
        return Finding(
            "edited",
            host,
            f"edited by hand: {path} ({noun})",
            detail=(
                f"{where} would rewrite it; the diff goes from the node's file to what the playbook renders "
                "(a hand edit, or inventory variables changed since the last converge)"
            ),
            diff=diff,
            category=category,
            source=source,
        )
    if category == "hold":
        label = record.get("item") or "a package"
        title = f"hold: {label} would be held again ({where})"
    elif category == "package":
        title = f"package: {where}{item} would change packages"
    elif category == "service":
        title = f"service: {where}{item} would change a unit's state"
    elif category == "firewall":
        title = f"firewall: {record.get('msg') or 'table differs'} ({where} would load the rules again)"
    elif path and _is_missing(record):
        title = f"{category}: {path} is missing ({where}{item} would create it)"
    elif path:
        title = f"{category}: {path} would change ({where}{item})"
    else:
        title = f"would change: {where}{item}"
    if record.get("censored"):
        title += " (content hidden by no_log)"
    detail = "" if record.get("censored") else str(record.get("msg") or "")
    return Finding("converge", host, title, detail=detail, diff=diff, category=category, source=source)


def converge_findings(
    records: list[dict[str, Any]],
    bad_lines: int,
    run: dict[str, Any],
    run_id: str,
) -> tuple[list[Finding], list[str], dict[str, Any]]:
    """Findings and notes from the converge's record and its exit, and a summary of the run.

    `run`: rc, stdout_tail, stderr_tail, error (the task around it failed: timeout), skipped.
    """
    findings: list[Finding] = []
    notes: list[str] = []
    summary: dict[str, Any] = {"ran": not run.get("skipped"), "rc": run.get("rc"), "records": len(records)}
    if run.get("skipped"):
        notes.append("the check-mode converge was skipped (drift_converge is false)")
        summary["complete"] = False
        return findings, notes, summary
    starts = [r for r in records if r["kind"] == "start"]
    stats = [r for r in records if r["kind"] == "stats"]
    mine = bool(starts) and all(r.get("run_id") == run_id for r in starts)
    summary["complete"] = mine and bool(stats)
    tail = _tail(run)
    rc = run.get("rc")
    if not mine:
        exited = f"exited {rc} and " if rc not in (0, None) else ""
        findings.append(
            Finding(
                "run",
                None,
                f"the check-mode converge {exited}left no record of this run",
                detail=(
                    "the kimi_drift_changes callback did not write the changes file for this run: the converge "
                    "did not start, or the callback was not loaded (callback_plugins in ansible.cfg, "
                    "ANSIBLE_CALLBACK_PLUGINS)" + (f"; {run['error']}" if run.get("error") else "")
                ),
                diff=tail,
            )
        )
        return findings, notes, summary
    if not all(r.get("check_mode") for r in starts):
        findings.append(Finding("run", None, "the converge ran without --check: drift.yml must never converge"))
    if run.get("error"):
        findings.append(Finding("run", None, f"the check-mode converge did not finish: {run['error']}", diff=tail))
    elif rc not in (0, None):
        findings.append(
            Finding(
                "run",
                None,
                f"the check-mode converge exited {rc}",
                detail="its last lines follow; the tasks that failed are listed per host",
                diff=tail,
            )
        )
    elif not stats:
        findings.append(Finding("run", None, "the check-mode converge ended without its summary", diff=tail))
    if bad_lines:
        notes.append(f"{bad_lines} line(s) of the changes file were not readable JSON")
    for record in records:
        kind = record["kind"]
        if kind in ("change", "would_run"):
            findings.append(change_finding(record))
        elif kind == "failed":
            message = "" if record.get("censored") else str(record.get("msg") or "").strip()
            first = message.splitlines()[0] if message else "(no message)"
            item = f" [{record['item']}]" if record.get("item") else ""
            if record.get("ignored"):
                notes.append(f"{record.get('host')}: the converge ignores a failure of {_task_ref(record)}: {first}")
                continue
            tails = [
                "\n".join(record.get(key) or [])
                for key in ("stderr_tail", "stdout_tail", "module_stderr_tail")
                if record.get(key)
            ]
            findings.append(
                Finding(
                    "converge_failed",
                    record.get("host"),
                    f"converge task failed: {_task_ref(record)}{item}: {first}",
                    detail=message if "\n" in message else "",
                    diff="\n".join(tails),
                    source=_source(record),
                )
            )
        elif kind == "unreachable":
            findings.append(
                Finding(
                    "converge_failed",
                    record.get("host"),
                    f"unreachable during the converge ({_task_ref(record)}): {record.get('msg') or ''}".rstrip(),
                    source=_source(record),
                )
            )
        elif kind == "unchecked":
            notes.append(f"{record.get('host')}: check mode cannot evaluate {_task_ref(record)}")
    summary["changes"] = sum(1 for r in records if r["kind"] in ("change", "would_run"))
    summary["failures"] = sum(1 for r in records if r["kind"] in ("failed", "unreachable") and not r.get("ignored"))
    if stats:
        summary["stats"] = stats[-1].get("hosts", {})
    return findings, notes, summary


def _tail(run: dict[str, Any]) -> str:
    lines = list(run.get("stdout_tail") or [])[-TAIL_LINES:]
    errors = list(run.get("stderr_tail") or [])[-TAIL_LINES:]
    if errors:
        lines += ["--- stderr ---", *errors]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- parity


def parity_findings(parity: dict[str, Any] | None) -> tuple[list[Finding], list[str]]:
    """kimi_parity's failures as findings: pinned versions, holds, and every other cross-node break."""
    if not parity:
        return [], []
    if parity.get("failed") and not parity.get("failures"):
        return [Finding("incomplete", None, f"parity could not run: {parity.get('msg', 'unknown error')}")], []
    findings = []
    for failure in parity.get("failures") or []:
        host = failure.get("host")
        item = str(failure.get("item", ""))
        prefix = item.split(":", 1)[0]
        if prefix == "hold":
            kind = "hold"
        elif prefix in ("deb", "wheel") and failure.get("expected_from") in ("pin", "override"):
            kind = "version"
        else:
            kind = "parity"
        message = str(failure.get("message") or item)
        title = message[len(f"{host}: ") :] if host and message.startswith(f"{host}: ") else message
        findings.append(
            Finding(
                kind,
                host,
                title,
                fix=str(failure.get("fix") or ""),
                category=prefix,
                source={"item": item, "value": failure.get("value"), "expected": failure.get("expected")},
            )
        )
    notes = [f"warning: {w.get('message')}" for w in parity.get("parity_warnings") or []]
    return findings, notes


# ------------------------------------------------------------------------------------------ checkpoint


def marker_text(read: dict[str, Any] | None) -> tuple[str | None, str | None]:
    """(text, problem) from a slurp result of the marker: problem is 'missing', 'unreadable: ...' or None."""
    if not read or read.get("skipped"):
        return None, "not read"
    if "content" in read:
        try:
            return base64.b64decode(read["content"]).decode("utf-8", errors="replace"), None
        except ValueError as error:
            return None, f"unreadable: {error}"
    message = str(read.get("msg", ""))
    if "not found" in message or "No such file" in message:
        return None, "missing"
    return None, f"unreadable: {message or 'no content'}"


def checkpoint_state(
    host: str, read: dict[str, Any] | None, expected: dict[str, Any], files: dict[str, Any] | None = None
) -> tuple[str, list[Finding]]:
    """The marker's state on one node (ok, missing, unverified, mismatch, old marker, changed, corrupt, ...)
    and why it is drift.

    The pin verdict is the checkpoint role's own (pin_matches, and the marker version). A branch revision
    (checkpoint_allow_branch) is compared by the name the marker says it was resolved from, since drift does
    not ask the Hub. `files`: the node's answer of kimi_checkpoint_info (each recorded file's
    stat compared with the marker, and the rotating sample hashed), absent or skipped when not read.
    """
    repo_id = str(expected.get("repo_id") or "")
    revision = str(expected.get("revision") or "")
    include = list(expected.get("include") or [])
    exclude = list(expected.get("exclude") or [])
    path = expected.get("marker_path") or "the checkpoint marker"
    if not repo_id or not revision:
        return "not set", [
            Finding(
                "incomplete",
                host,
                "checkpoint_repo_id and checkpoint_revision are not set: the marker cannot be compared",
                fix="set checkpoint_repo_id and checkpoint_revision in the inventory, or drift_check_checkpoint: false",
            )
        ]
    text, problem = marker_text(read)
    fix = "run the checkpoint phase: ansible-playbook site.yml --tags checkpoint"
    if problem == "missing":
        return "missing", [Finding("checkpoint", host, f"no checkpoint marker at {path}", fix=fix)]
    if problem:
        return "unreadable", [Finding("checkpoint", host, f"checkpoint marker {path} {problem}", fix=fix)]
    marker = read_marker(text)
    if marker is None:
        return "unreadable", [Finding("checkpoint", host, f"checkpoint marker {path} is not valid JSON", fix=fix)]
    if pin_matches(marker, repo_id, revision, include, exclude):
        pinned = True
    elif not is_commit_sha(revision) and expected.get("allow_branch"):
        resolved = marker.get("resolved_from")
        pinned = pin_matches(marker, repo_id, str(marker.get("revision") or ""), include, exclude)
        pinned = pinned and resolved == revision
    else:
        pinned = False
    if not pinned or (marker.get("version") != MARKER_VERSION and not is_old_marker(marker)):
        differences = []
        for key, wanted in (("repo_id", repo_id), ("revision", revision), ("include", include), ("exclude", exclude)):
            have = marker.get(key) if key in ("repo_id", "revision") else list(marker.get(key) or [])
            if key == "revision" and not is_commit_sha(revision):
                have = marker.get("resolved_from")
            if have != wanted:
                differences.append(f"{key} is {json.dumps(have)}, pinned {json.dumps(wanted)}")
        if marker.get("version") != MARKER_VERSION:
            differences.append(f"marker version {marker.get('version')}, expected {MARKER_VERSION}")
        title = f"checkpoint marker does not match the pin: {'; '.join(differences) or 'differs'}"
        return "mismatch", [Finding("checkpoint", host, title, detail=str(path), fix=fix)]
    if not marker.get("verified_at"):
        return "unverified", [Finding("checkpoint", host, f"checkpoint marker {path} records no verification", fix=fix)]
    if is_old_marker(marker):
        title = (
            f"checkpoint marker {path} is version {marker.get('version')}: it records no per-file size, mtime and "
            "inode, so the checkpoint files cannot be checked until the next converge rewrites it"
        )
        rewrite = f"{fix} (it verifies every file once and rewrites the marker as version {MARKER_VERSION})"
        return "old marker", [Finding("checkpoint", host, title, fix=rewrite)]
    return checkpoint_files_state(host, files, str(path))


def checkpoint_files_state(host: str, files: dict[str, Any] | None, marker_path: str) -> tuple[str, list[Finding]]:
    """The files a current marker records: changed since their verification (their stat), or, for the
    rotating sample, not the content the marker's Hub checksum says."""
    if not files or files.get("skipped"):
        return "ok", []
    if files.get("failed") or "stale" not in files:
        message = " ".join(str(files.get("msg") or "no answer").split())
        return "unknown", [Finding("checkpoint", host, f"could not check the checkpoint files: {message}")]
    directory = marker_path.rsplit("/", 1)[0] if "/" in marker_path else "the checkpoint directory"
    findings = []
    stale = list(files.get("stale") or [])
    for problem in stale[:CHANGED_FILES_SHOWN]:
        findings.append(
            Finding(
                "checkpoint",
                host,
                f"checkpoint file {problem}",
                detail=(
                    f"in {directory}: the marker recorded this file's size, mtime and inode when it was verified; "
                    "it was overwritten, replaced or removed since"
                ),
                fix="run the checkpoint phase: ansible-playbook site.yml --tags checkpoint (it verifies the changed "
                "files and fetches the bad ones again)",
                category="stat",
            )
        )
    if len(stale) > CHANGED_FILES_SHOWN:
        more = len(stale) - CHANGED_FILES_SHOWN
        findings.append(
            Finding(
                "checkpoint",
                host,
                f"{more} more checkpoint file(s) changed since their verification",
                detail="; ".join(stale[CHANGED_FILES_SHOWN:]),
                fix="run the checkpoint phase: ansible-playbook site.yml --tags checkpoint",
                category="stat",
            )
        )
    for problem in files.get("sample_problems") or []:
        findings.append(
            Finding(
                "checkpoint",
                host,
                f"checkpoint file {problem} (rotating sample hash; its size, mtime and inode are as recorded)",
                detail=f"in {directory}: content changed while its stat was kept (or restored)",
                # Its stat matches the marker: only a forced verification makes the role look at it.
                fix="ansible-playbook site.yml --tags checkpoint -e checkpoint_force_verify=true",
                category="sample",
            )
        )
    if files.get("sample_problems"):
        return "corrupt", findings
    return ("changed" if stale else "ok"), findings


# --------------------------------------------------------------------------------------------- service


def expected_unit(rank: int | None, layout: str) -> str | None:
    """The vLLM unit a node of this rank runs (the serve role's rule): none for a Ray worker."""
    if rank is None:
        return None
    if rank == 0:
        return API_UNIT
    return None if layout == "ray" else HEADLESS_UNIT


def service_state(host: str, rank: int | None, layout: str, read: dict[str, Any] | None) -> tuple[str, list[Finding]]:
    """Whether this node's vLLM unit is installed and active, and no other kimi-vllm unit is around."""
    if not read or read.get("skipped"):
        return "not read", []
    if read.get("rc") not in (0, None) or "stdout" not in read:
        message = (read.get("stderr") or read.get("msg") or "").strip()
        return "unknown", [Finding("service", host, f"could not read the vLLM units' state: {message}")]
    units = parse_systemctl_show(read.get("stdout") or "")
    wanted = expected_unit(rank, layout)
    findings = []
    state = "-"
    for name in (API_UNIT, HEADLESS_UNIT):
        unit = units.get(name, {"LoadState": "not-found", "ActiveState": "inactive"})
        loaded = unit.get("LoadState") == "loaded"
        active = unit.get("ActiveState") or "unknown"
        sub = unit.get("SubState") or ""
        if name == wanted:
            state = active if loaded else "not installed"
            if not loaded:
                findings.append(
                    Finding(
                        "service",
                        host,
                        f"{name} is not installed (LoadState={unit.get('LoadState')})",
                        fix="run the serve phase: ansible-playbook site.yml --tags serve",
                    )
                )
            elif active != "active":
                findings.append(
                    Finding(
                        "service",
                        host,
                        f"{name} is {active}" + (f" ({sub})" if sub else ""),
                        detail=f"journalctl -u {name} on {host} says why",
                        fix="restart the whole group with the serve phase: ansible-playbook site.yml --tags serve",
                    )
                )
        elif loaded or active == "active":
            findings.append(
                Finding(
                    "service",
                    host,
                    f"{name} is installed here ({active}) but node rank {rank} runs "
                    + (wanted or "no vLLM unit in this layout"),
                    fix="run the serve phase: it stops and removes units a node no longer runs",
                )
            )
    return state, findings


def health_state(host: str, probe: dict[str, Any] | None) -> tuple[str, list[Finding]]:
    """rank 0's /health, asked from rank 0 itself: 200 is the only healthy answer."""
    if not probe or probe.get("skipped"):
        return "-", []
    status = probe.get("status")
    url = probe.get("url") or "/health"
    if status == 200:
        return "200", []
    if isinstance(status, int) and status > 0:
        return str(status), [Finding("health", host, f"{url} answered {status}, not 200")]
    message = str(probe.get("msg") or "no answer").strip()
    return "down", [Finding("health", host, f"{url} did not answer: {message}")]


# ----------------------------------------------------------------------------------------------- report


def _matches_any(finding: Finding, patterns: list[re.Pattern[str]]) -> bool:
    text = f"{finding.kind} {finding.host or 'cluster'} {finding.title}"
    return any(pattern.search(text) for pattern in patterns)


def _dedupe_holds(findings: list[Finding]) -> list[Finding]:
    """A pinned deb that is not held shows up twice (parity, and the converge's dpkg_selections); keep parity's."""
    held = {(f.host, str(f.source.get("item", "")).split(":", 1)[-1]) for f in findings if f.kind == "hold"}
    return [
        f
        for f in findings
        if not (f.kind == "converge" and f.category == "hold" and (f.host, f.source.get("item")) in held)
    ]


def replica_groups(host_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per replica: its hosts (report order), whether it drifted, on which hosts, its finding count by kind.

    Replicas come sorted by name (as kimi_replicas lists them); hosts in no replica last, as one group whose
    name is None (a host drift covers that serves in no replica: the inventory's replica groups are wrong).
    """
    names = sorted({row["replica"] for row in host_rows if row["replica"] is not None})
    if any(row["replica"] is None for row in host_rows):
        names.append(None)
    groups = []
    for name in names:
        rows = [row for row in host_rows if row["replica"] == name]
        by_kind: Counter[str] = Counter()
        for row in rows:
            by_kind.update(row["counts"])
        groups.append(
            {
                "name": name,
                "hosts": [row["host"] for row in rows],
                "drifted": any(row["drifted"] for row in rows),
                "hosts_drifted": [row["host"] for row in rows if row["drifted"]],
                "findings": sum(by_kind.values()),
                "by_kind": dict(by_kind),
            }
        )
    return groups


def node_layout(node: dict[str, Any] | None, layout: str) -> str:
    """The serve layout of the node's own replica (each replica may set its own), else the run's."""
    return str((node or {}).get("layout") or layout)


def build_report(
    *,
    hosts: list[str],
    ranks: dict[str, int] | None = None,
    replica_of: Mapping[str, str] | None = None,
    layout: str = "mp",
    records: list[dict[str, Any]] | None = None,
    bad_lines: int = 0,
    run: dict[str, Any] | None = None,
    run_id: str = "",
    parity: dict[str, Any] | None = None,
    nodes: dict[str, dict[str, Any]] | None = None,
    checkpoint: dict[str, Any] | None = None,
    checks: dict[str, bool] | None = None,
    problems: list[str] | None = None,
    ignore: list[str] | None = None,
    generated_at: str = "",
    context: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The whole drift report: per-host findings and states, per replica its hosts and verdict, cluster
    findings, notes, the verdict.

    replica_of: host -> the replica it serves in; a host it does not name is in no replica. None: every host
    is the one replica `default` (an inventory without kimi_replica_<name> groups).
    nodes[host]: unreachable (bool), msg, stack_error (kimi_stack_facts failed), marker (slurp result),
    checkpoint_files (kimi_checkpoint_info: stats and sample), units (systemctl show result),
    health (uri result, rank 0 only). checks: which checks ran (converge, checkpoint,
    service, health). problems: things drift itself could not establish (the pin set), reported as
    `incomplete`.
    """
    ranks = ranks or {}
    nodes = nodes or {}
    checks = {"converge": True, "checkpoint": True, "service": True, "health": True, **(checks or {})}
    patterns = [re.compile(p) for p in ignore or []]
    findings: list[Finding] = []
    notes: list[str] = []

    for problem in problems or []:
        findings.append(Finding("incomplete", None, problem))
    converge_summary: dict[str, Any] = {"ran": False}
    if checks["converge"] or run:
        run = run or {"skipped": not checks["converge"]}
        found, more_notes, converge_summary = converge_findings(records or [], bad_lines, run, run_id)
        findings += found
        notes += more_notes
    found, more_notes = parity_findings(parity)
    findings += found
    notes += more_notes

    checkpoint = checkpoint or {}
    if checks["checkpoint"] and not (checkpoint.get("repo_id") and checkpoint.get("revision")):
        # One finding for the cluster, not one per node: the setting is missing, not a node's marker.
        findings.append(
            Finding(
                "incomplete",
                None,
                "checkpoint_repo_id and checkpoint_revision are not set: the checkpoint markers cannot be compared",
                fix="set them in the inventory, or drift_check_checkpoint: false",
            )
        )
        checks = {**checks, "checkpoint": False}
    states: dict[str, dict[str, str]] = {}
    unreachable = set()
    for host in hosts:
        node = nodes.get(host) or {}
        states[host] = {"checkpoint": "-", "service": "-", "health": "-"}
        if node.get("unreachable"):
            unreachable.add(host)
            findings.append(
                Finding("unreachable", host, f"could not be read: {str(node.get('msg') or 'unreachable').strip()}")
            )
            states[host] = {"checkpoint": "?", "service": "?", "health": "?"}
            continue
        if checks["checkpoint"]:
            state, found = checkpoint_state(host, node.get("marker"), checkpoint, node.get("checkpoint_files"))
            states[host]["checkpoint"] = state
            findings += found
            sampled = (node.get("checkpoint_files") or {}).get("sampled") or []
            if sampled and state in ("ok", "changed"):
                notes.append(f"{host}: checkpoint sample hashed, as the marker records: {', '.join(sampled)}")
        if checks["service"]:
            state, found = service_state(host, ranks.get(host), node_layout(node, layout), node.get("units"))
            states[host]["service"] = state
            findings += found
        if checks["health"]:
            state, found = health_state(host, node.get("health"))
            states[host]["health"] = state
            findings += found
    # parity's "no stack facts" for a node already reported unreachable says nothing new; for a node that
    # answered, the module's own error says why
    findings = [f for f in findings if not (f.category == "facts" and f.host in unreachable)]
    for finding in findings:
        error = (nodes.get(finding.host or "") or {}).get("stack_error")
        if finding.category == "facts" and error:
            finding.title = " ".join(f"the stack could not be read: {error}".split())
    findings = _dedupe_holds(findings)

    kept = [f for f in findings if not _matches_any(f, patterns)]
    ignored = [f for f in findings if _matches_any(f, patterns)]
    order = {kind: index for index, kind in enumerate(KINDS)}
    host_order = {host: index for index, host in enumerate(hosts)}
    kept.sort(key=lambda f: (host_order.get(f.host or "", -1), order.get(f.kind, len(KINDS))))

    host_rows = []
    for host in hosts:
        mine = [f for f in kept if f.host == host]
        host_rows.append(
            {
                "host": host,
                "replica": DEFAULT_REPLICA if replica_of is None else (replica_of.get(host) or None),
                "rank": ranks.get(host),
                "unit": expected_unit(ranks.get(host), node_layout(nodes.get(host), layout)),
                "drifted": bool(mine),
                "states": states[host],
                "counts": dict(Counter(f.kind for f in mine)),
                "findings": [asdict(f) for f in mine],
            }
        )
    others = [f for f in kept if f.host not in host_order]
    drifted = bool(kept)
    replicas = replica_groups(host_rows)
    return {
        "schema": REPORT_SCHEMA,
        "generated_at": generated_at,
        "drifted": drifted,
        "summary": {
            "hosts": len(hosts),
            "hosts_drifted": [row["host"] for row in host_rows if row["drifted"]],
            "replicas": len([group for group in replicas if group["name"] is not None]),
            "replicas_drifted": [group["name"] for group in replicas if group["drifted"] and group["name"] is not None],
            "findings": len(kept),
            "by_kind": dict(Counter(f.kind for f in kept)),
            "ignored": len(ignored),
        },
        "context": context or {},
        "checks": checks,
        "converge": converge_summary,
        "parity": {
            "ok": (parity or {}).get("ok"),
            "summary": (parity or {}).get("summary"),
        },
        "hosts": host_rows,
        "replicas": replicas,
        "cluster_findings": [asdict(f) for f in others],
        "notes": notes,
        "ignored": [asdict(f) for f in ignored],
        "messages": [f.line() for f in others] + [f.line() for f in kept if f.host in host_order],
    }


def exit_code(report: dict[str, Any]) -> int:
    """0 only when nothing drifted (what a scheduler keys on); drift.yml turns 1 into a failed play."""
    return 1 if report.get("drifted") else 0


# ------------------------------------------------------------------------------------------- rendering


def grouped(report: dict[str, Any]) -> bool:
    """Whether the report shows its hosts per replica: only with several groups, so that a one-replica
    inventory's table and Markdown stay as they were before replicas."""
    return len(report.get("replicas") or []) > 1


def replica_label(name: str | None) -> str:
    return "no replica" if name is None else name


def _columns(report: dict[str, Any]) -> tuple[tuple[str, tuple[str, ...] | None], ...]:
    if not grouped(report):
        return TABLE_COLUMNS
    return (TABLE_COLUMNS[0], REPLICA_COLUMN, *TABLE_COLUMNS[1:])


def _cell(row: dict[str, Any], column: str, kinds: tuple[str, ...] | None) -> str:
    if column == "host":
        return row["host"]
    if column == "replica":
        return replica_label(row.get("replica"))
    if column == "rank":
        return "-" if row["rank"] is None else str(row["rank"])
    if column == "verdict":
        return "DRIFT" if row["drifted"] else "ok"
    count = sum(row["counts"].get(kind, 0) for kind in kinds or ())
    if column in ("checkpoint", "service", "health"):
        state = row["states"].get(column, "-")
        return f"{state} !" if count else state
    return f"{count} !" if count else "ok"


def render_table(report: dict[str, Any]) -> str:
    """The short table the play prints: a row per host, a column per check, `!` where it drifted (and a
    column naming each host's replica when there are several)."""
    columns = _columns(report)
    header = [name for name, _ in columns]
    lines = [header]
    for row in report["hosts"]:
        lines.append([_cell(row, name, kinds) for name, kinds in columns])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in lines]
    text.insert(1, "  ".join("-" * width for width in widths))
    summary = report["summary"]
    cluster = report["cluster_findings"]
    if report["drifted"]:
        verdict = f"DRIFT: {summary['findings']} finding(s)"
        if summary["hosts_drifted"]:
            verdict += f" on {', '.join(summary['hosts_drifted'])}"
        if grouped(report) and summary.get("replicas_drifted"):
            verdict += f" (replica {', '.join(summary['replicas_drifted'])})"
        if cluster:
            verdict += f"; {len(cluster)} about the cluster or the converge run"
    else:
        verdict = f"no drift on {summary['hosts']} host(s)"
        if grouped(report):
            verdict += f" in {summary['replicas']} replica(s)"
    if summary.get("ignored"):
        verdict += f" ({summary['ignored']} ignored by drift_ignore)"
    return "\n".join([verdict, "", *text])


def _fence(text: str) -> str:
    """A Markdown code fence longer than any run of backticks inside the text."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _finding_markdown(finding: dict[str, Any]) -> list[str]:
    lines = [f"- **{finding['kind']}**: {finding['title']}"]
    if finding.get("detail"):
        lines.append(f"  - {finding['detail']}".replace("\n", "\n    "))
    if finding.get("fix"):
        lines.append(f"  - fix: `{finding['fix']}`")
    if finding.get("diff"):
        fence = _fence(finding["diff"])
        language = "diff" if finding["diff"].startswith("---") else "text"
        lines += ["", f"  {fence}{language}"]
        lines += [f"  {line}" if line else "" for line in finding["diff"].splitlines()]
        lines += [f"  {fence}", ""]
    return lines


def _host_markdown(row: dict[str, Any], level: str) -> list[str]:
    """A host's findings under its own heading; nothing for a host without any."""
    if not row["findings"]:
        return []
    rank = "" if row["rank"] is None else f" (node rank {row['rank']})"
    lines = [f"{level} {row['host']}{rank}", ""]
    for finding in row["findings"]:
        lines += _finding_markdown(finding)
    lines.append("")
    return lines


def _replica_markdown(group: dict[str, Any], host_rows: list[dict[str, Any]]) -> list[str]:
    """A replica's heading with its verdict, hosts and counts, then its hosts' findings one level below."""
    verdict = "DRIFT" if group["drifted"] else "no drift"
    heading = "In no replica" if group["name"] is None else f"Replica {group['name']}"
    facts = f"hosts {', '.join(group['hosts'])}"
    if group["drifted"]:
        facts += f"; {group['findings']} finding(s) on {', '.join(group['hosts_drifted'])}"
    lines = [f"## {heading}: {verdict}", "", facts, ""]
    for row in host_rows:
        if row["host"] in group["hosts"]:
            lines += _host_markdown(row, "###")
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    """The report for people: the verdict, the table, then every finding per host with its diff and fix
    (under a heading per replica, with its verdict, when there are several)."""
    context = report.get("context") or {}
    title = "drift: DRIFT" if report["drifted"] else "drift: no drift"
    lines = [f"# Kimi K2 cluster {title}", ""]
    facts = [f"generated {report.get('generated_at') or '-'}"]
    if context.get("inventory"):
        facts.append(f"inventory {', '.join(context['inventory'])}")
    converge = report.get("converge") or {}
    if converge.get("ran"):
        facts.append(f"check-mode converge exit {converge.get('rc')}, {converge.get('changes', 0)} change(s)")
    lines += ["; ".join(facts), "", "```text", render_table(report), "```", ""]
    if report["cluster_findings"]:
        lines += ["## Cluster and converge run", ""]
        for finding in report["cluster_findings"]:
            lines += _finding_markdown(finding)
        lines.append("")
    if grouped(report):
        for group in report["replicas"]:
            lines += _replica_markdown(group, report["hosts"])
    else:
        for row in report["hosts"]:
            lines += _host_markdown(row, "##")
    if report["notes"]:
        lines += ["## Notes (not drift)", ""]
        lines += [f"- {note}" for note in report["notes"]]
        lines.append("")
    if report["ignored"]:
        lines += ["## Ignored (drift_ignore)", ""]
        lines += [f"- {f['host'] or 'cluster'}: {f['kind']}: {f['title']}" for f in report["ignored"]]
        lines.append("")
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"


def report_json(report: dict[str, Any]) -> str:
    return kimi_report.report_json(report)
