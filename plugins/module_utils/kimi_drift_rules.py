"""Drift's checks and its report: parity's failures, the checkpoint marker and its files, the vLLM units, rank 0's
/health, each a list of findings per host, and build_report, which puts them with the converge's record
(kimi_drift_record) into one report grouped by serving replica, with one verdict.

A finding is drift unless an ignore pattern matches it; warnings (kernel or OS differences, tasks check mode
cannot evaluate, failures the converge itself ignores) are notes and never change the verdict.

Separate from kimi_drift_record (which it imports: Finding and the converge's findings) because these rules read
the other inputs drift.yml gathers (kimi_parity's result, each node's checkpoint marker, systemctl, /health) and
lean on other modules' contracts (kimi_checkpoint's marker, kimi_serve's unit names); and from kimi_drift_render,
which only shows a finished report and needs none of this.
"""

from __future__ import annotations

import base64
import json
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from .kimi_checkpoint import (
    MARKER_VERSION,
    is_commit_sha,
    is_old_marker,
    pin_matches,
    read_marker,
)
from .kimi_drift_record import KINDS, Finding, converge_findings
from .kimi_replicas import DEFAULT_REPLICA
from .kimi_serve import API_UNIT, HEADLESS_UNIT
from .kimi_systemd import parse_systemctl_show

REPORT_SCHEMA = 1
# Changed checkpoint files named one finding each, up to this many; the rest are counted in one more finding.
CHANGED_FILES_SHOWN = 10


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
    (kimi_checkpoint_allow_branch) is compared by the name the marker says it was resolved from, since drift does
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
                "kimi_checkpoint_repo_id and kimi_checkpoint_revision are not set: the marker cannot be compared",
                fix=(
                    "set kimi_checkpoint_repo_id and kimi_checkpoint_revision in the inventory, or "
                    "drift_check_checkpoint: false"
                ),
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
                "kimi_checkpoint_repo_id and kimi_checkpoint_revision are not set: the checkpoint markers cannot be "
                "compared",
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
