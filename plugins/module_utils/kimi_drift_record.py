"""Drift's vocabulary and the converge's record: what a finding is, the kinds of finding, and the findings read
from the JSON lines the kimi_drift_changes callback wrote during a check-mode converge (which task would change
what, on which host, with which diff).

Drift of a converged cluster is everything that no longer equals what site.yml would make of it: the inputs are
plain data gathered by playbooks/drift.yml, nothing in these modules touches a node or the network, and every rule
is unit-tested on its own (tests/unit/plugins/module_utils/test_kimi_drift.py). The code is cut in three along what
depends on what: this module (the record, and Finding, which the rules build on), kimi_drift_rules (parity,
checkpoint, service and health checks and the report that assembles them) and kimi_drift_render (the table,
Markdown and JSON of a finished report). This one is separate because it reads one input, the record that
plugins/callback/kimi_drift_changes.py writes, and nothing else: the callback's own tests classify its records
with this module's classify, without the rules or the rendering.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from typing import Any

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
# Lines of the converge's own output kept when it failed: the end is where the reason is.
TAIL_LINES = 40


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
